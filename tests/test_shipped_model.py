"""The shipped checkpoint loads by default and answers prompts exactly, from one token to 499, unseen ones too,
with or without a preamble (a system prompt it ignores) before them."""

import pytest

from minillm.engine.generate import generate
from minillm.model.checkpoint import DEFAULT_CHECKPOINT, checkpoint_info
from minillm.model.tokenizer import decode, encode_prompt
from minillm.runs.run import run_workload
from minillm.runs.workload import SEED_STORY, SEED_STORY_SLOTS
from minillm.training import tasks
from minillm.training.train import evaluate


def test_checkpoint_is_small_safetensors_with_its_config_inside():
    assert DEFAULT_CHECKPOINT.suffix == ".safetensors"
    assert DEFAULT_CHECKPOINT.stat().st_size <= 10 * 2**20
    info = checkpoint_info()
    assert info["config"]["max_seq_len"] >= 1024 and "heldout_accuracy" in info
    assert set(info["heldout_accuracy"]) == {"none", *tasks.PREAMBLES, "random"}  # measured with and without


@pytest.mark.parametrize(
    "prompt",
    ["count down from 1", "spell 7", "spell 4096", "count down from 10", "count down from 152", "count down from 123"],
)
def test_shipped_model_answers_exactly_and_stops_at_eos(shipped_model, prompt):
    out = generate(shipped_model, encode_prompt(prompt), max_new_tokens=600)
    assert out.finish_reason == "eos"
    assert decode(out.tokens) == tasks.solve(prompt)


def test_held_out_prompts_are_answered_exactly(shipped_model):
    assert tasks.is_held_out("count down from 123")  # the last prompt above was never trained on
    results = evaluate(shipped_model, per_task=12, seed=7, progress=False, preambles=["none"])
    for task in tasks.TASKS:
        r = results["none"][task]
        assert r["total"] == 12 and r["correct"] / r["total"] >= 0.9, f"{task}: {r}"


@pytest.mark.parametrize(
    "name, prompt",
    [
        ("assistant", "count down from 64"),
        ("teacher", "spell 2024"),
        ("workshop", "count down from 99"),
        ("rules", ""),
    ],
)
def test_shipped_model_ignores_a_fixed_preamble(shipped_model, name, prompt):
    preamble = tasks.PREAMBLES[name]
    prompt = prompt or f"count down from {tasks.longest_countdown(preamble)}"  # the reply ends at position 1023
    ids = encode_prompt(prompt, preamble)
    out = generate(shipped_model, ids, max_new_tokens=tasks.CONTEXT - len(ids))
    assert out.finish_reason == "eos"
    assert decode(out.tokens) == tasks.solve(prompt)


@pytest.mark.parametrize(
    "preamble, prompt", [("count down from 30", "spell 2024"), ("spell 123456", "count down from 12")]
)
def test_the_task_after_the_preamble_wins_even_when_the_preamble_is_a_task(shipped_model, preamble, prompt):
    out = generate(shipped_model, encode_prompt(prompt, preamble), max_new_tokens=100)
    assert out.finish_reason == "eos" and decode(out.tokens) == tasks.solve(prompt)


def test_held_out_prompts_after_preambles_are_answered_exactly(shipped_model):
    """After the longest fixed preamble, and after random text never seen in training."""
    results = evaluate(shipped_model, per_task=4, seed=7, progress=False, preambles=["rules", "random"])
    for name, rows in results.items():
        r = rows["overall"]
        assert r["total"] >= 7 and r["correct"] >= r["total"] - 1, f"{name}: {rows}"  # at most one miss


def test_every_seed_story_reply_ends_at_its_own_eos(shipped_model):
    """The story on screen is the model's real answers: each reply is right and ends at its EOS, before its cap."""
    trace = run_workload(shipped_model, "seed-story", "continuous")
    lengths = {rid: (prompt, n) for rid, prompt, n in SEED_STORY}
    for r in trace.requests:
        prompt, n = lengths[r.id]
        assert r.finish_reason == "eos", f"{r.id} ({prompt!r}) was cut: {decode(r.output_ids)!r}"
        assert decode(r.output_ids) == tasks.solve(prompt) and len(r.output_ids) + 1 == n
    first_batch = sorted(n for *_, n in SEED_STORY[:SEED_STORY_SLOTS])
    assert first_batch[-1] > 5 * first_batch[-2]  # the story's shape: one long reply, the rest done long before
