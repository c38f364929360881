"""The cost model of speculative decoding (minillm/card/speculation.py) and the bench's reading of measurements."""

from __future__ import annotations

import pytest

from minillm.bench.speculation import agree, crossing
from minillm.card.hardware import get_device
from minillm.card.modelspec import load_spec
from minillm.card.roofline import max_users, step_cost
from minillm.card.speculation import (
    Pricing,
    alpha_from_tokens,
    card_crossover,
    expected_tokens,
    speculation_cost,
    users_that_fit,
)
from minillm.errors import ConfigError

BIG, SMALL = load_spec("llama-3.1-8b"), load_spec("llama-3.2-1b")


def test_llama_3_2_1b_has_its_published_size():
    # Meta's model card: 1.23 B parameters (1.24 B on the Hugging Face page); tied embeddings, GQA 32/8
    assert 1.23e9 <= SMALL.num_parameters <= 1.24e9 and SMALL.tied_embeddings and SMALL.kv_heads == 8


@pytest.mark.parametrize("alpha, k, tokens", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 2, 1.75), (0.8, 1, 1.8)])
def test_a_verify_row_gains_one_plus_alpha_plus_alpha_squared(alpha, k, tokens):
    assert expected_tokens(alpha, k) == pytest.approx(tokens)
    if 0 < alpha < 1:
        assert alpha_from_tokens(tokens, k) == pytest.approx(alpha, abs=1e-9)
    with pytest.raises(ConfigError):
        expected_tokens(1.5, k)


def test_one_user_on_a_card_gets_nearly_e_over_the_drafts_share():
    """Batch 1 is memory-bound: a verify step reads what a decode step reads, so the speedup is about
    E / (1 + k x the draft's weight bytes / the model's)."""
    h100 = get_device("h100-sxm")
    cost = speculation_cost(BIG, SMALL, h100, 1, 4, 0.8, context=1024)
    assert cost.verify_s == pytest.approx(cost.decode_s, rel=0.05)
    ratio = cost.draft_s / cost.decode_s
    assert cost.speedup == pytest.approx(expected_tokens(0.8, 4) / (1 + 4 * ratio), rel=0.05)
    assert 1.5 < cost.speedup < 2.5


def test_the_verify_step_pays_for_logits_at_every_position():
    card = get_device("rtx-4090")
    cost = speculation_cost(BIG, SMALL, card, 256, 8, 0.8, context=128)
    chunk = step_cost(BIG, card, [(9, 128)] * 256)  # a prompt chunk: logits at its last token only
    assert cost.verify_s > chunk.time_s


def test_speculation_stops_paying_later_when_guesses_are_better_and_the_batch_fills_first():
    card = get_device("rtx-4090")
    worse, better = card_crossover(BIG, SMALL, card, 4, 0.6, 128), card_crossover(BIG, SMALL, card, 4, 0.9, 128)
    assert worse is not None and better is not None and worse < better
    assert speculation_cost(BIG, SMALL, card, worse, 4, 0.6, 128).speedup < 1
    assert speculation_cost(BIG, SMALL, card, worse - 1, 4, 0.6, 128).speedup >= 1
    assert card_crossover(BIG, SMALL, card, 8, 0.0, 128) == 1  # guesses never right: it never pays
    assert users_that_fit(BIG, SMALL, card, 1024) < max_users(BIG, card, 1024)  # the draft takes memory too


def test_a_fixed_cost_per_step_favours_speculation():
    """Python and launches per step are paid once per speculative step for several tokens."""
    card = get_device("h100-sxm")
    plain = speculation_cost(BIG, SMALL, card, 64, 4, 0.8, 512)
    heavy = speculation_cost(BIG, SMALL, card, 64, 4, 0.8, 512, Pricing(step_overhead_s=0.05))
    assert heavy.speedup > plain.speedup


def test_the_measured_crossing_is_interpolated_between_the_batches_around_it():
    rows = [{"batch": 16, "s": 1.5}, {"batch": 32, "s": 1.2}, {"batch": 64, "s": 0.8}]
    assert 32 < crossing(rows, "s") < 64 and crossing(rows, "s") == pytest.approx(32 * 2**0.5)
    assert crossing([{"batch": 1, "s": 1.2}, {"batch": 2, "s": 1.1}], "s") is None
    assert crossing([{"batch": 1, "s": 0.9}], "s") == 1.0


def test_measured_and_predicted_crossovers_agree_within_a_factor_of_two():
    assert agree(40.0, 64, 128) and agree(100.0, 60, 128) and not agree(20.0, 64, 128)
    assert agree(None, 80, 128) and agree(None, None, 128) and not agree(None, 40, 128)
    assert not agree(30.0, None, 128)


def test_this_machines_prices_follow_the_op_by_op_predictor(shipped_model):
    """On a CPU a verify row's k + 1 tokens share its row's costs (the KV gathered once, the calls, a bigger matmul
    per call): a verify step costs far less than k + 1 decode steps, and a draft step less than a decode step."""
    from minillm.card.calibrate import load_or_calibrate
    from minillm.card.speculation import ThisMachine
    from minillm.layers.drafters import DRAFT_CHECKPOINT
    from minillm.model.checkpoint import load_model

    here = ThisMachine(shipped_model, load_model(DRAFT_CHECKPOINT, "cpu"), load_or_calibrate("cpu", progress=False))
    one = here.cost(1, 4, 0.9, 180)
    assert one.draft_s < one.decode_s < one.verify_s < 5 * one.decode_s and one.speedup > 1
    assert here.cost(64, 4, 0.0, 180).speedup < 1  # guesses never right: every one is paid for nothing
    assert here.cost(128, 8, 0.7, 30).speedup < here.cost(8, 8, 0.7, 30).speedup  # short contexts: batching wins
