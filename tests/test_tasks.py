"""The training tasks: every reply is the one correct answer, and the held-out tenth never leaks into training."""

import random

import pytest

from minillm import tasks


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
