"""Model descriptions from config.json: exact parameter counts against the published totals."""

import json

import pytest

from minillm.card.modelspec import MODELS_DIR, load_spec, shipped_models, spec_from_config
from minillm.errors import ConfigError
from minillm.serving.export import llama_config

# Published totals. Each checkpoint is bf16, so its model.safetensors.index.json total_size / 2 is the
# parameter count; the Hugging Face API's safetensors.total and llama.cpp's general.parameter_count give
# the same numbers (cross-checked in public code with the project's search tool):
PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248,  # meta-llama/Llama-3.1-8B: total_size 16,060,522,496 bytes / 2
    "llama-3.1-70b": 70_553_706_496,  # meta-llama/Llama-3.1-70B: safetensors.total
    "mistral-7b": 7_241_732_096,  # mistralai/Mistral-7B-v0.1: general.parameter_count
    "qwen2.5-7b": 7_615_616_512,  # Qwen/Qwen2.5-7B: safetensors.total
    "qwen3-0.6b": 596_049_920,  # Qwen/Qwen3-0.6B: transformers' model.num_parameters()
    "llama-2-7b": 6_738_415_616,  # meta-llama/Llama-2-7b-hf: llama.cpp's general.parameter_count, transformers' too
    "llama-3.2-1b": 1_235_814_400,  # meta-llama/Llama-3.2-1B: model.safetensors holds 2,471,628,800 bytes of bf16
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_total(name):
    assert load_spec(name).num_parameters == PUBLISHED[name]


def test_the_tiny_model_counts_like_the_shipped_checkpoint(shipped_model):
    assert load_spec("minillm-tiny").num_parameters == shipped_model.num_parameters() == 2_953_472


def test_the_tiny_config_is_what_export_writes(shipped_model):
    shipped = json.loads((MODELS_DIR / "minillm-tiny.json").read_text())
    for key, value in llama_config(shipped_model.cfg).items():
        assert shipped[key] == value, key


# The models people run now: experts, latent attention, sliding windows (counted in tests/test_moe_mla.py)
TODAYS = {"deepseek-v3", "gpt-oss-20b", "gpt-oss-120b", "qwen3-30b-a3b", "mixtral-8x7b", "gemma-3-27b"}


def test_every_shipped_model_loads():
    assert set(shipped_models()) == {*PUBLISHED, *TODAYS, "minillm-tiny", "opt-13b", "gpt3-13b", "gpt3-175b"}
    assert all(load_spec(name).num_parameters > 0 for name in shipped_models())


LLAMA_LIKE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 100}  # fmt: skip


def test_head_dim_defaults_to_hidden_over_heads_and_a_given_one_wins():
    assert spec_from_config(LLAMA_LIKE, "x").head_dim == 16
    assert spec_from_config({**LLAMA_LIKE, "head_dim": 32}, "x").head_dim == 32
    qwen3 = load_spec("qwen3-0.6b")
    assert qwen3.head_dim == 128 != 1024 // 16  # Qwen3 sets it: q is 2048 wide on a 1024 residual


def test_family_quirks_are_counted():
    base = spec_from_config(LLAMA_LIKE, "x").num_parameters
    # q: 4 heads x 16, k and v: 2 x 16 each; per layer, two layers
    assert spec_from_config({**LLAMA_LIKE, "model_type": "qwen2"}, "x").num_parameters == base + 2 * (64 + 32 + 32)
    assert spec_from_config({**LLAMA_LIKE, "model_type": "qwen3"}, "x").num_parameters == base + 2 * (16 + 16)
    assert spec_from_config({**LLAMA_LIKE, "tie_word_embeddings": True}, "x").num_parameters == base - 100 * 64
    assert spec_from_config({**LLAMA_LIKE, "attention_bias": True}, "x").num_parameters == base + 2 * (128 + 64)


def test_missing_kv_heads_means_multi_head_attention():
    config = {k: v for k, v in LLAMA_LIKE.items() if k != "num_key_value_heads"}
    assert spec_from_config(config, "x").kv_heads == 4


def test_a_config_json_by_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_LIKE))
    assert load_spec(path).num_parameters == load_spec(str(path)).num_parameters > 0


def test_unknown_model_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="llama-3.1-8b.*qwen3-0.6b"):
        load_spec("gpt-5")


@pytest.mark.parametrize(
    "text,needle",
    [("{not json", "not valid JSON"), ('{"hidden_size": 8}', "lacks"), ("[1, 2]", "not a config.json object")],
)
def test_broken_config_files_say_what_is_wrong(tmp_path, text, needle):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_spec(path)


def test_a_missing_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec(tmp_path / "nope.json")


# --- config.json mistakes: each a clear error, never a traceback or a silently wrong shape ---------------------
@pytest.mark.parametrize(
    "change,needle",
    [
        ({"num_attention_heads": 0}, "num_attention_heads = 0"),  # was a ZeroDivisionError
        ({"hidden_size": "64"}, "hidden_size must be a number, got '64' (str)"),  # was a TypeError
        ({"num_key_value_heads": 0}, "num_key_value_heads = 0"),  # was taken as full attention
        ({"hidden_size": 64.7}, "hidden_size must be a whole number, got 64.7"),  # was truncated to 64
        ({"num_hidden_layers": True}, "num_hidden_layers must be a number"),
        ({"hidden_size": 66}, "not a multiple of num_attention_heads"),  # head_dim would be 16.5
    ],
)
def test_config_mistakes_say_what_is_wrong(change, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        spec_from_config({**LLAMA_LIKE, **change}, "x")


def test_whole_numbers_written_as_floats_are_accepted():
    assert spec_from_config({**LLAMA_LIKE, "hidden_size": 64.0}, "x") == spec_from_config(LLAMA_LIKE, "x")


def test_a_model_folder_is_read_through_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    assert load_spec(tmp_path).num_parameters == load_spec(tmp_path / "config.json").num_parameters
    empty = tmp_path / "weights-only"
    empty.mkdir()
    with pytest.raises(ConfigError, match="folder without a config.json"):
        load_spec(empty)
