"""The models people run now in the cost model: experts, latent attention, sliding windows (issue 44)."""

import json
import random

import pytest

from minillm.__main__ import main
from minillm.card import roofline
from minillm.card.experts import expected_experts
from minillm.card.hardware import get_device
from minillm.card.kv_layout import window_tally
from minillm.card.modelspec import load_spec, spec_from_config
from minillm.card.simulate import SimulatedRunner
from minillm.card.tensor_parallel import rank_spec, tp_choices
from minillm.card.whatif import plan, summary
from minillm.errors import ConfigError

# Published totals and parameters used per token, (total, active, how the maker counts "active"):
PUBLISHED = {
    # DeepSeek-V3 Technical Report (arXiv 2412.19437), abstract: "671B total parameters with 37B activated for each
    # token" (the main model; the checkpoint's 685B add the 14B multi-token-prediction module, README)
    "deepseek-v3": (671e9, 37e9, "with the embedding table"),
    # gpt-oss-120b & gpt-oss-20b model card (OpenAI, arXiv 2508.10925), Table 1: 116.83B total, 5.13B active;
    # 20.91B and 3.61B. Its active count leaves out the embedding table (the unembedding is in)
    "gpt-oss-120b": (116.83e9, 5.13e9, "without the embedding table"),
    "gpt-oss-20b": (20.91e9, 3.61e9, "without the embedding table"),
    # Mistral AI, "Mixtral of experts" (2023-12-11): "46.7B total parameters but only uses 12.9B parameters per token"
    "mixtral-8x7b": (46.7e9, 12.9e9, "with the embedding table"),
    # Qwen/Qwen3-30B-A3B model card: "Number of Parameters: 30.5B in total and 3.3B activated"
    "qwen3-30b-a3b": (30.5e9, 3.3e9, "with the embedding table"),
    # Gemma 3 Technical Report (arXiv 2503.19786): "ranging in scale from 1 to 27 billion parameters"; the text model
    # (the 0.4B SigLIP vision encoder is not counted: the cost model is text-only). A dense model: all are active
    "gemma-3-27b": (27e9, 27e9, "with the embedding table"),
}
WITHIN = 0.03


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_totals_and_active_counts(name):
    spec = load_spec(name)
    total, active, counted = PUBLISHED[name]
    ours = spec.active_parameters - (spec.embedding_params if counted == "without the embedding table" else 0)
    assert spec.num_parameters == pytest.approx(total, rel=WITHIN)
    assert ours == pytest.approx(active, rel=WITHIN)


def test_the_exact_counts_of_the_checkpoints():
    # Mixtral-8x7B-v0.1: 46,702,792,704 parameters (model.safetensors.index.json total_size 93,405,585,408 / 2)
    assert load_spec("mixtral-8x7b").num_parameters == 46_702_792_704
    # DeepSeek-V3's main model: 671,026,419,200 (the checkpoint's tensors counted, MTP module and fp8 scales left
    # out, as public audits of its safetensors headers find); README_WEIGHTS.md's active "36.6B" leaves out the
    # embedding table and counts the output head
    v3 = load_spec("deepseek-v3")
    assert v3.num_parameters == 671_026_419_200
    assert round((v3.active_parameters - v3.embedding_params) / 1e8) == 366
    # gpt-oss: 116,829,156,672 and 20,914,757,184, the model card's 116.83B and 20.91B to the digit shown
    assert round(load_spec("gpt-oss-120b").num_parameters / 1e7) == 11683
    assert round(load_spec("gpt-oss-20b").num_parameters / 1e7) == 2091


def test_each_family_is_read_from_its_own_fields():
    names = ("deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b", "mixtral-8x7b", "gemma-3-27b")
    v3, oss, qwen, mixtral, gemma = (load_spec(n) for n in names)
    assert (v3.experts, v3.experts_per_token, v3.shared_experts, v3.expert_intermediate) == (256, 8, 1, 2048)
    assert (v3.moe_layers, v3.dense_layers, v3.intermediate) == (58, 3, 18432)  # first_k_dense_replace = 3
    assert (v3.kv_lora_rank, v3.qk_rope_head_dim, v3.q_lora_rank, v3.head_dim) == (512, 64, 1536, 192)
    assert (oss.experts, oss.experts_per_token, oss.moe_layers, oss.expert_intermediate) == (128, 4, 36, 2880)
    assert (oss.sliding_window, oss.window_layers, oss.attention_sinks, oss.mlp_bias) == (128, 18, True, True)
    assert (qwen.experts, qwen.experts_per_token, qwen.expert_intermediate, qwen.moe_layers) == (128, 8, 768, 48)
    assert qwen.qk_norm and not qwen.window_layers  # use_sliding_window: false
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.expert_intermediate) == (8, 2, 14336)
    # text_config lifted; vocab, context and the 5:1 pattern from transformers' Gemma3TextConfig defaults
    assert (gemma.hidden, gemma.vocab, gemma.max_context, gemma.tied_embeddings) == (5376, 262_208, 131_072, True)
    assert (gemma.sliding_window, gemma.window_layers, gemma.norms_per_layer) == (1024, 52, 4)
    assert load_spec("mistral-7b").window_layers == 0  # every layer windowed, no pattern: still priced as full


TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 100}  # fmt: skip


def test_which_layers_have_experts():
    qwen = {**TINY, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    assert spec_from_config(qwen, "x").moe_layers == 6
    assert spec_from_config({**qwen, "mlp_only_layers": [0, 5]}, "x").moe_layers == 4
    assert spec_from_config({**qwen, "decoder_sparse_step": 2}, "x").moe_layers == 3  # layers 1, 3, 5
    v3 = {**TINY, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 2}
    spec = spec_from_config({**v3, "first_k_dense_replace": 2}, "x")
    assert (spec.moe_layers, spec.shared_experts) == (4, 2)
    dense = spec_from_config(TINY, "x")
    one_moe_layer = 32 * 3 * 64 * (8 + 2) + 8 * 64  # every expert, the shared ones and the router
    assert spec.num_parameters == dense.num_parameters + 4 * (one_moe_layer - 3 * 64 * 96)
    assert spec.active_parameters == spec.num_parameters - 4 * (8 - 2) * 3 * 64 * 32


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"num_local_experts": 4, "num_experts_per_tok": 5}, "between 1 and 4"),
        ({"num_local_experts": 4}, "num_experts_per_tok"),
        ({"kv_lora_rank": 16, "qk_rope_head_dim": 8}, "qk_nope_head_dim"),
        ({"sliding_window": 8, "layer_types": ["sliding_attention"] * 5}, "each of its 6 layers"),
        ({"num_experts": 4, "num_experts_per_tok": 1, "mlp_only_layers": [9]}, "mlp_only_layers"),
    ],
)
def test_a_config_that_contradicts_itself_is_one_clear_error(extra, needle):
    with pytest.raises(ConfigError, match=needle):
        spec_from_config({**TINY, **extra}, "x")


@pytest.mark.parametrize("experts, k, batch", [(8, 2, 3), (32, 4, 8), (128, 4, 64), (256, 8, 32), (256, 8, 1)])
def test_the_expected_experts_formula_against_random_routing(experts, k, batch):
    """B tokens each pick k distinct experts uniformly; the mean count of distinct experts over many draws is
    E (1 - (1 - k/E)^B), within 2%."""
    rng = random.Random(experts * 1000 + batch)
    draws = 2000
    seen = sum(len({e for _ in range(batch) for e in rng.sample(range(experts), k)}) for _ in range(draws)) / draws
    assert seen == pytest.approx(expected_experts(experts, k, batch), rel=0.02)


def test_a_decode_step_streams_the_experts_its_batch_touches():
    spec, card = load_spec("gpt-oss-120b"), get_device("h200")
    every = roofline.streamed_weight_bytes(spec)
    steps = [roofline.decode_cost(spec, card, batch, 0) for batch in (1, 2, 8, 64, 512, 4096)]
    weights = [s.weight_bytes - spec.hidden * 2 * s.tokens for s in steps]  # less the embedding rows looked up
    assert weights == sorted(weights) and weights[-1] == pytest.approx(every, rel=1e-6)
    one_token = spec.active_parameters - spec.embedding_params  # what one token multiplies through
    assert weights[0] == pytest.approx(2 * one_token, rel=1e-9)  # bf16: 2 bytes a weight
    attention = spec.layers * 4 * spec.heads * spec.head_dim  # the one token against its own key, in every layer
    assert steps[0].flops == 2 * spec.active_matmul_params + 2 * spec.vocab * spec.hidden + attention
    # the seeds' rule: a dense model's second row is nearly free; an MoE's brings in experts nobody had picked
    dense = load_spec("llama-3.1-70b")
    extra = lambda s: roofline.decode_cost(s, card, 2, 0).memory_s / roofline.decode_cost(s, card, 1, 0).memory_s
    assert extra(dense) < 1.001 and extra(spec) > 1.5


def test_latent_attention_caches_the_latent_and_the_rope_key():
    v3 = load_spec("deepseek-v3")
    assert roofline.kv_bytes_per_token(v3) == 61 * (512 + 64) * 2 == 70_272  # 68.6 KiB a token in bf16
    assert roofline.kv_bytes_per_token(v3, "fp8") == 35_136
    eight = rank_spec(v3, 8)
    assert roofline.kv_bytes_per_token(eight) == 70_272  # every card keeps the whole latent
    assert 8 in tp_choices(v3) and eight.expert_intermediate == 256 and eight.heads == 16
    # absorbed decode: per cached token and head, 512 + 64 for the score and 512 for the value
    one, two = (roofline.decode_cost(v3, get_device("h200"), 1, context) for context in (1000, 2000))
    assert two.flops - one.flops == 1000 * 61 * 2 * 128 * (2 * 512 + 64)
    assert two.kv_read_bytes - one.kv_read_bytes == 1000 * 70_272


def test_a_sliding_window_layer_stops_growing_at_its_window():
    gemma = load_spec("gemma-3-27b")
    per_layer = 2 * 16 * 128 * 2  # bytes per token and layer
    assert roofline.kv_bytes_per_token(gemma) == 62 * per_layer
    assert roofline.kv_bytes_per_user(gemma, 512) == 62 * per_layer * 512  # inside the window: every layer grows
    assert roofline.kv_bytes_per_user(gemma, 32768) == (10 * 32768 + 52 * 1024) * per_layer
    card = get_device("h200")
    users = roofline.max_users(gemma, card, 32768)
    full = roofline.kv_blocks(gemma, card) // (32768 // 16)  # were every layer global
    assert users > 4 * full
    context = roofline.max_context(gemma, card, users)
    assert context >= 32768 and roofline.max_users(gemma, card, context) >= users
    assert roofline.max_users(gemma, card, context + 16 * 64) < users


def test_the_window_tally_counts_what_each_token_sees():
    rows = [(1, 0), (1, 5000), (300, 0), (700, 900), (3, 1020)]
    window = 1024
    cached, keys = window_tally(rows, window)
    assert cached == sum(min(before, window) for _, before in rows)
    assert keys == sum(min(before + i + 1, window) for new, before in rows for i in range(new))


def test_dense_models_are_priced_as_before():
    """Nothing new touches a dense model: its step is the Llama-shaped formula, to the byte and the FLOP."""
    spec, card = load_spec("llama-3.1-8b"), get_device("rtx-4090")
    step = roofline.decode_cost(spec, card, 8, 1000)
    assert step.flops == 8 * 2 * 32 * spec.layer_matmul_params + 8 * 2 * spec.vocab * 4096 + 4 * 32 * 32 * 128 * 8008
    assert step.weight_bytes == roofline.streamed_weight_bytes(spec) + 8 * 4096 * 2
    assert step.kv_read_bytes == 8 * 1000 * 131072


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_whatif_gives_users_speed_and_the_reason(name):
    p = plan(load_spec(name), get_device("h200"), "fp8", context=8192, batch=16, tp=8 if name == "deepseek-v3" else 1)
    assert p["weights_fit"] and p["max_users"] >= 16 and p["tokens_per_s"] > 0
    assert p["why"], "an MoE, latent or windowed model says why it serves as it does"
    text = summary(p)
    assert "why" in text and p["why"][0] in text


def test_the_reasons_are_computed():
    v3 = plan(load_spec("deepseek-v3"), get_device("h200"), "fp8", context=4096, batch=32, tp=8)
    assert "latent attention: 68.6 KiB per token instead of 4.8 MiB" in "\n".join(v3["why"])
    assert "71x less" in "\n".join(v3["why"]) and "8 + 1 shared of 256 experts" in v3["why"][0]
    oss = plan(load_spec("gpt-oss-20b"), get_device("rtx-4090"), "int4", context=32768)
    assert "12 of 24 layers keep only the last 128 tokens" in oss["why"][1]
    assert "batch 1 touches 4 of 32 per layer" in oss["why"][0]
    dense = plan(load_spec("llama-3.1-8b"), get_device("rtx-4090"))
    assert dense["why"] == [] and "\n  why" not in summary(dense)


def test_a_model_too_big_for_one_card_names_the_fix(capsys):
    assert main(["run", "--simulate", "deepseek-v3", "--gpu", "h200", "--dtype", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "does not fit on h200" in err and "tensor parallelism" in err and "--tp 8" in err


def test_a_simulated_moe_run_streams_its_experts():
    from minillm.runs.run import run_workload
    from minillm.runs.workload import ChatKnobs

    runner = SimulatedRunner(load_spec("gpt-oss-20b"), get_device("h100-sxm"))
    trace = run_workload(runner, "azure-conv", knobs=ChatKnobs(requests=20, rate_per_s=4.0))
    assert all(r.finish_reason == "eos" for r in trace.requests)
    assert trace.config["num_blocks"] == roofline.kv_blocks(runner.spec, runner.card)


def test_whatif_json_for_an_moe_model(capsys):
    main(["whatif", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--batch", "8", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["active_params"] < result["params"] / 8 and result["why"]


def test_the_published_check_counts_one_token_s_experts():
    """bench/published.py's line of why: one stream of an MoE moves the experts its token picked, a dense model all."""
    from minillm.bench.published import _one_token_weights

    dense, moe = load_spec("llama-3.1-8b"), load_spec("gpt-oss-20b")
    assert _one_token_weights(dense, "bf16") == roofline.weight_bytes(dense, "bf16")
    moved = _one_token_weights(moe, "int4")
    assert 0.1 * roofline.weight_bytes(moe, "int4") < moved < 0.5 * roofline.weight_bytes(moe, "int4")
