"""Tensor parallelism priced on real cards (card/tensor_parallel.py): one card's share, the collectives, the links."""

import dataclasses

import pytest

from minillm.bench.published import FIGURES, GOALS, predict
from minillm.card import roofline
from minillm.card.enginecost import engine_step
from minillm.card.hardware import DEVICES, LINKS, Link
from minillm.card.modelspec import ModelSpec, load_spec
from minillm.card.simulate import SimulatedRunner
from minillm.card.tensor_parallel import check_tp, rank_spec, tp_choices, tp_decode, tp_step
from minillm.card.whatif import plan
from minillm.errors import ConfigError

TOY = ModelSpec("toy", hidden=8, intermediate=16, layers=2, heads=4, kv_heads=2, head_dim=2, vocab=10)
WIRE = Link("toy-link", "toy link", bandwidth=1000.0, latency_s=1e-3)  # 1000 bytes/s one way, 1 ms a collective
H100, A100 = DEVICES["h100-sxm"], DEVICES["a100-80gb-sxm"]
ROWS = ([(1, 0)], [(1, 4096)] * 64, [(2048, 0)], [(1, 300), (7, 12), (1, 5000)])


# --- tp = 1 is one card, number for number ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b", "qwen3-0.6b", "mistral-7b"])
def test_one_card_is_the_model_itself_and_every_number_is_unchanged(name):
    spec = load_spec(name)
    assert rank_spec(spec, 1) is spec
    for rows in ROWS:
        step = tp_step(spec, H100, rows, "bf16", "fp8", 1)
        assert step.rank == engine_step(spec, H100, rows, "bf16", "fp8")
        assert step.time_s == engine_step(spec, H100, rows, "bf16", "fp8").time_s and step.comm_s == 0
    p = plan(spec, H100, "fp8", "bf16", context=4096, batch=32)  # (fp8: a 70B model's weights fit one card)
    assert p["tp"] == 1 and p["link"] is None and p["comm_share"] == 0 and p["comm_share_by_tp"] is None
    assert p["decode_step_s"] == engine_step(spec, H100, [(1, 4096)] * 32, "fp8").time_s
    assert p["bound_step_s"] == roofline.decode_cost(spec, H100, 32, 4096, "fp8").time_s
    assert p["max_users"] == roofline.max_users(spec, H100, 4096, "fp8") > 0
    assert p["weight_bytes"] == p["total_weight_bytes"] == roofline.weight_bytes(spec, "fp8")
    assert SimulatedRunner(spec, H100, "fp8", tp=1).pool_blocks(16) == roofline.kv_blocks(spec, H100, "fp8")


# --- one card's share -------------------------------------------------------------------------------------
def test_a_card_holds_one_tpth_of_the_weights_the_kv_and_the_flops():
    spec = load_spec("llama-3.1-70b")
    norms = (2 * spec.layers + 1) * spec.hidden * 2  # bf16 norm weights: every card holds them whole
    for tp in (2, 4, 8):
        rank = rank_spec(spec, tp)
        assert (rank.heads, rank.kv_heads, rank.intermediate) == (64 // tp, 8 // tp, 28672 // tp)
        assert rank.hidden == spec.hidden and rank.head_dim == spec.head_dim  # every card holds all of x
        assert roofline.weight_bytes(rank) * tp == roofline.weight_bytes(spec) + (tp - 1) * norms
        assert roofline.kv_bytes_per_token(rank) * tp == roofline.kv_bytes_per_token(spec)
        for rows in ROWS:  # 128,256 splits evenly by 8: every FLOP is counted exactly once over the cards
            assert roofline.step_cost(rank, H100, rows).flops * tp == roofline.step_cost(spec, H100, rows).flops


def test_the_all_reduces_cost_latency_plus_two_tp_minus_one_over_tp_of_the_activations():
    spec = load_spec("llama-3.1-70b")
    for tp, tokens, rows in ((8, 64, [(1, 1000)] * 64), (2, 2048, [(2048, 0)]), (4, 10, [(3, 5), (7, 0)])):
        step = tp_step(spec, H100, rows, tp=tp)
        per = 2 * (tp - 1) / tp * tokens * 8192 * 2  # each rank sends this much in one all-reduce of bf16 activations
        assert step.allreduces == 2 * 80 + 1  # after o_proj and down_proj in every layer, and the embedding lookup
        assert step.allreduce_bytes == pytest.approx(161 * per)
        assert step.gather_bytes == pytest.approx((tp - 1) / tp * len(rows) * 128256 * 2)
        wire = LINKS["nvlink-4"]
        sent = step.allreduce_bytes + step.gather_bytes
        assert step.comm_s == pytest.approx(162 * wire.latency_s + sent / 450e9)
        assert step.time_s == pytest.approx(engine_step(rank_spec(spec, tp), H100, rows).time_s + step.comm_s)


def test_the_collectives_by_hand_on_a_toy_link():
    step = tp_step(TOY, H100, [(1, 3), (1, 0)], "fp32", "fp32", tp=2, link=WIRE)
    # 5 all-reduces (2 layers x 2 + 1) of 2 tokens x 8 wide x 4 bytes, each rank sending 2(2-1)/2 of each
    assert step.allreduces == 5 and step.allreduce_bytes == 5 * 1.0 * 2 * 8 * 4 == 320
    assert step.gather_bytes == 0.5 * 2 * 10 * 4 == 40  # logits of 2 rows, half of them from the other card
    assert step.comm_s == pytest.approx(6 * 1e-3 + 360 / 1000)
    assert step.comm_share == pytest.approx(step.comm_s / (step.rank.time_s + step.comm_s))


def test_users_that_fit_grow_with_tp_faster_than_the_cards():
    spec = load_spec("llama-3.1-8b")
    users = {tp: plan(spec, H100, context=4096, tp=tp)["max_users"] for tp in (1, 2, 4, 8)}
    assert users[1] > 0
    for tp in (2, 4, 8):  # each card's KV grows by the weights it no longer holds: more than tp x the users
        assert users[tp] > tp * users[1] and users[tp] > users[tp // 2]


@pytest.mark.parametrize("card", [H100, A100], ids=lambda d: d.name)
def test_a_70b_model_needs_several_80_gb_cards(card):
    spec = load_spec("llama-3.1-70b")
    one = plan(spec, card)  # 141 GB of bf16 weights, 72 GiB usable on one card
    assert not one["weights_fit"] and one["max_users"] == 0 and one["tokens_per_s"] is None
    for tp in (4, 8):
        p = plan(spec, card, tp=tp)
        assert p["weights_fit"] and p["max_users"] > 0 and p["weight_bytes"] < card.memory_bytes * 0.9 / 2
        assert p["tokens_per_s"] > 0 and p["link"] == card.link


def test_the_link_matters_pcie_is_slower_than_nvlink_at_tp_8():
    spec = load_spec("llama-3.1-70b")
    nvlink, pcie = (plan(spec, H100, batch=64, tp=8, link=link) for link in ("nvlink-4", "pcie-4"))
    assert nvlink["link"] == "nvlink-4" and pcie["link"] == "pcie-4"
    assert pcie["comm_s"] > 4 * nvlink["comm_s"] and pcie["decode_step_s"] > nvlink["decode_step_s"]
    assert pcie["comm_share"] > nvlink["comm_share"]
    # the same split over PCIe (RTX 4090s), big prompt chunks: the all-reduces take over half the step
    assert tp_step(load_spec("llama-3.1-8b"), DEVICES["rtx-4090"], [(2048, 0)], tp=8).comm_share > 0.5


def test_more_cards_more_of_the_step_is_the_all_reduces():
    spec = load_spec("llama-3.1-8b")
    shares = plan(spec, H100, batch=16, tp=8)["comm_share_by_tp"]
    assert list(shares) == tp_choices(spec) == [1, 2, 4, 8] and shares[1] == 0
    assert shares[2] < shares[4] < shares[8]  # each card's work shrinks as 1/tp, a collective's latency does not
    faster = [tp_decode(spec, H100, 1, 4096, tp=tp).time_s for tp in (1, 2, 4, 8)]
    assert faster == sorted(faster, reverse=True)  # still faster for one user at every step up


@pytest.mark.parametrize("tp", [3, 16, 0])
def test_a_tp_that_does_not_split_the_heads_names_the_ones_that_do(tp):
    with pytest.raises(ConfigError) as e:
        check_tp(load_spec("llama-3.1-70b"), tp)
    if tp:
        assert f"--tp {tp} cannot split llama-3.1-70b" in str(e.value) and "choose one of 1, 2, 4, 8" in str(e.value)
        assert "64 query heads, 8 key/value heads, 28672 MLP columns" in str(e.value)
    else:
        assert "at least 1" in str(e.value)


def test_a_card_without_a_known_link_asks_for_one():
    m2 = DEVICES["apple-m2-ultra"]
    assert m2.link is None and plan(load_spec("llama-3.1-8b"), m2)["tp"] == 1  # one card needs no link
    with pytest.raises(ConfigError, match="--link"):
        plan(load_spec("llama-3.1-8b"), m2, tp=2)
    assert plan(load_spec("llama-3.1-8b"), m2, tp=2, link="pcie-5")["link"] == "pcie-5"
    with pytest.raises(ConfigError, match="unknown link 'nvlink-9'; known: nvlink-4"):
        plan(load_spec("llama-3.1-8b"), H100, tp=2, link="nvlink-9")


def test_every_card_names_a_link_that_exists():
    for name, card in DEVICES.items():
        assert card.link is None or card.link in LINKS, name
    assert {d.link for d in (H100, DEVICES["h200"], A100)} == {"nvlink-4", "nvlink-3"}
    assert {DEVICES[n].link for n in ("rtx-4090", "rtx-3090", "l4")} == {"pcie-4"}
    assert LINKS["nvlink-4"].bandwidth == 900e9 / 2 and LINKS["nvlink-3"].bandwidth == 600e9 / 2  # one way


# --- the simulated card, split ------------------------------------------------------------------------------
def test_a_simulated_split_holds_more_kv_and_charges_the_collectives():
    spec = load_spec("llama-3.1-70b")
    with pytest.raises(ConfigError, match="does not fit on h100-sxm"):
        SimulatedRunner(spec, H100).pool_blocks(16)
    four, eight = (SimulatedRunner(spec, H100, tp=tp) for tp in (4, 8))
    assert eight.pool_blocks(16) > 2 * four.pool_blocks(16) > 0 and eight.device == "simulated h100-sxm x 8 (nvlink-4)"
    slow = dataclasses.replace(H100, name="h100-pcie-link", link="pcie-4")
    assert SimulatedRunner(spec, slow, tp=8).link.name == "pcie-4"


def test_the_published_multi_gpu_figures_name_their_runs():
    split = [f for f in FIGURES if f.tp > 1]
    assert len(split) >= 4 and {f.kind for f in split} == {"tp decode", "tp batched"}
    assert len({f.source for f in split}) >= 3 and all(f"TP {f.tp}" in f.label for f in split)
    assert GOALS["tp decode"] == GOALS["tp batched"] == 0.35


@pytest.mark.parametrize("figure", [f for f in FIGURES if f.kind == "tp decode" and f.model == "llama-2-70b"],
                         ids=lambda f: f.label)  # fmt: skip
def test_one_user_of_a_70b_model_split_over_a100s_lands_within_its_goal(figure):
    """Memory-bound, with a card's share of the weights 9-35 GB: what the model counts is most of the step."""
    predicted, run = predict(figure)
    assert run["summary"]["output_tokens"] == figure.reply
    assert predicted == pytest.approx(figure.reported, rel=GOALS["tp decode"])
