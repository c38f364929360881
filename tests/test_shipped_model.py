"""The shipped checkpoint loads by default and answers prompts exactly, from one token to 499, unseen ones too."""

import pytest

from minillm import tasks
from minillm.checkpoint import DEFAULT_CHECKPOINT, checkpoint_info
from minillm.generate import generate
from minillm.tokenizer import decode, encode_prompt
from minillm.train import evaluate


def test_checkpoint_is_small_safetensors_with_its_config_inside():
    assert DEFAULT_CHECKPOINT.suffix == ".safetensors"
    assert DEFAULT_CHECKPOINT.stat().st_size <= 10 * 2**20
    info = checkpoint_info()
    assert info["config"]["max_seq_len"] >= 1024 and "heldout_accuracy" in info


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
    results = evaluate(shipped_model, per_task=12, seed=7, progress=False)
    for task in tasks.TASKS:
        r = results[task]
        assert r["total"] == 12 and r["correct"] / r["total"] >= 0.9, f"{task}: {r}"
