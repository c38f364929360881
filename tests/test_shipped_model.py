"""The shipped checkpoint loads by default and answers prompts exactly, from one token to 491."""

import pytest

from minillm import tasks
from minillm.checkpoint import DEFAULT_CHECKPOINT, checkpoint_info
from minillm.generate import generate
from minillm.tokenizer import decode, encode_prompt


def test_checkpoint_is_small_safetensors_with_its_config_inside():
    assert DEFAULT_CHECKPOINT.suffix == ".safetensors"
    assert DEFAULT_CHECKPOINT.stat().st_size <= 10 * 2**20
    info = checkpoint_info()
    assert info["config"]["max_seq_len"] >= 1024 and "heldout_accuracy" in info


@pytest.mark.parametrize(
    "prompt",
    ["count to 1", "count from 7 to 7", "spell 4096", "count to 5", "count down from 10", "count down from 150"],
)
def test_shipped_model_answers_exactly_and_stops_at_eos(shipped_model, prompt):
    out = generate(shipped_model, encode_prompt(prompt), max_new_tokens=600)
    assert out.finish_reason == "eos"
    assert decode(out.tokens) == tasks.solve(prompt)
