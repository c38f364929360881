"""The training tasks: every reply is the one correct answer, and the held-out tenth never leaks into training."""

import random

import pytest
import torch

from minillm.training import tasks


@pytest.mark.parametrize("task", list(tasks.TASKS))
def test_samples_are_solved_and_split_by_the_hash(task):
    rng = random.Random(0)
    for held_out in (False, True):
        for _ in range(200):
            prompt, reply = tasks.sample(task, rng, held_out=held_out)
            assert tasks.solve(prompt) == reply
            assert tasks.is_held_out(prompt) == held_out


def test_reply_lengths_span_one_token_to_hundreds():
    assert tasks.solve("count down from 1") == "1"
    assert len(tasks.solve(f"count down from {tasks.MAX_COUNT}")) >= 400
    assert tasks.solve("spell 4096") == "four zero nine six"


def test_the_held_out_split_is_about_a_tenth_and_never_drawn_for_training():
    prompts = {f"count down from {n}" for n in range(1, tasks.MAX_COUNT + 1)}
    held = {p for p in prompts if tasks.is_held_out(p)}
    assert 0.05 < len(held) / len(prompts) < 0.15
    rng = random.Random(1)
    trained = {tasks.sample("countdown", rng, held_out=False)[0] for _ in range(3000)}
    assert trained.isdisjoint(held) and len(trained) == len(prompts) - len(held)  # every other start is trained


@pytest.mark.parametrize("prompt", ["count to 5", "count down from 0", "count down from x", "spell", "spell 4x", ""])
def test_prompts_outside_the_tasks_have_no_answer(prompt):
    assert tasks.solve(prompt) is None


def test_trained_shapes_cover_the_tasks_within_their_sizes():
    assert tasks.is_trained_shape("count down from 152") and tasks.is_trained_shape("spell 999999")
    assert tasks.is_trained_shape("count down from 123")  # held out, but of a trained shape
    assert not tasks.is_trained_shape("count down from 153") and not tasks.is_trained_shape("spell 1234567")
    assert not tasks.is_trained_shape("count to 5")


# ---- preambles: system prompts the model learns to ignore ----


def test_fixed_preambles_are_readable_system_prompts_of_100_to_600_bytes():
    lengths = [len(text.encode()) for text in tasks.PREAMBLES.values()]
    assert 3 <= len(lengths) <= 6 and len(set(lengths)) == len(lengths)
    assert all(100 <= n <= 600 for n in lengths) and max(lengths) - min(lengths) >= 300
    for text in tasks.PREAMBLES.values():
        assert text.isascii() and all(c.isprintable() or c == "\n" for c in text)
        assert not any(c.isdigit() for c in text)  # the only number a request holds is its task's
        assert text.startswith("You are") and text.endswith(".")


def test_an_exchange_fits_when_every_token_counts():
    # <bos> preamble <sep> "count down from 152" (19) <sep> reply (499) <eos>: 522 tokens beside the preamble
    assert len(tasks.solve("count down from 152")) == 499
    assert tasks.fits("count down from 152", "x" * (1024 - 522))
    assert not tasks.fits("count down from 152", "x" * (1024 - 522 + 1))
    assert tasks.fits("count down from 152") and tasks.longest_countdown() == tasks.MAX_COUNT


@pytest.mark.parametrize("name", list(tasks.PREAMBLES))
def test_the_longest_countdown_after_each_preamble_fits_and_one_more_does_not(name):
    preamble = tasks.PREAMBLES[name]
    longest = tasks.longest_countdown(preamble)
    assert tasks.fits(f"count down from {longest}", preamble)
    assert longest == tasks.MAX_COUNT or not tasks.fits(f"count down from {longest + 1}", preamble)
    assert tasks.fits(f"spell {'9' * tasks.MAX_DIGITS}", preamble)  # every spelling fits after every preamble


def test_the_longest_preamble_shortens_the_longest_countdown():
    assert tasks.longest_countdown(max(tasks.PREAMBLES.values(), key=len)) < tasks.MAX_COUNT


@pytest.mark.parametrize("kind", ["none", "fixed", "random"])
def test_drawn_preambles_always_leave_room_for_the_reply(kind):
    rng = random.Random(0)
    low, high = tasks.RANDOM_PREAMBLE_BYTES
    for _ in range(300):
        prompt, _ = tasks.sample(rng.choice(list(tasks.TASKS)), rng, held_out=False)
        preamble = tasks.draw_preamble(rng, kind, prompt)
        assert tasks.fits(prompt, preamble)
        if kind == "none":
            assert preamble is None
        elif kind == "fixed":
            assert preamble in tasks.PREAMBLES.values() or not tasks.fits(prompt, min(tasks.PREAMBLES.values()))
        else:
            assert preamble is not None and len(preamble) <= high and preamble.isascii()


def test_packed_rows_compute_each_exchange_exactly_as_alone():
    """Training packs exchanges after one shared preamble; the mask must make each one see what it would alone."""
    from minillm.model.tokenizer import EOS, PAD, SEP
    from minillm.training.train import IGNORE, PackedRows, TrainConfig, packed_batches
    from tests.conftest import random_model

    model = random_model("gqa")  # context 256: two rows of 256 tokens
    batch = next(packed_batches(random.Random(2), TrainConfig(tokens_per_batch=512), 256))
    inputs, targets, positions, segments = batch  # (2, 256) each
    assert sorted((segments == 0).sum(dim=1).tolist())[0] == 1  # one row shares only <bos>...
    assert sorted((segments == 0).sum(dim=1).tolist())[1] > 100  # ...the other a preamble
    with torch.no_grad():
        packed = model(inputs, positions, PackedRows(segments))  # (B, T, V)
        for r in range(inputs.shape[0]):
            assert segments[r].max() >= 1 and (inputs[r][segments[r] == -1] == PAD).all()
            for k in range(1, int(segments[r].max()) + 1):
                own = segments[r] == k
                alone = inputs[r][(segments[r] == 0) | own]  # <bos> [preamble <sep>] prompt <sep> reply
                tokens = inputs[r][own].tolist()  # prompt <sep> reply
                prompt, reply = bytes(tokens[: tokens.index(SEP)]).decode(), tokens[tokens.index(SEP) + 1 :]
                assert bytes(reply).decode() == tasks.solve(prompt)
                assert targets[r][own][targets[r][own] != IGNORE].tolist() == [*reply, EOS]  # reply + EOS are learned
                logits = model(alone[None])[0, -int(own.sum()) :]  # the exchange's own tokens, computed alone
                assert torch.allclose(logits, packed[r][own], atol=1e-4)


def test_an_unknown_preamble_kind_is_a_config_error():
    from minillm.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown preamble kind 'long'"):
        tasks.draw_preamble(random.Random(0), "long", "spell 7")
