"""The cost model's arithmetic, worked out by hand on a toy model and a toy card, plus the real cards' facts."""

import math
from dataclasses import replace

import pytest

from minillm.bench.published import PUBLISHED_SINGLE_STREAM
from minillm.card import roofline
from minillm.card.hardware import DEVICES, Device, get_device
from minillm.card.modelspec import ModelSpec, load_spec
from minillm.errors import ConfigError

# 2 layers, residual 8, MLP 16, 2 query heads sharing 1 kv head of 4, vocabulary 10, untied lm_head.
TOY = ModelSpec("toy", hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4, vocab=10)
# 1000 bytes/s, 10^4 bf16 FLOP/s, half of peak in practice, 1 ms per kernel.
CARD = Device("toy-card", "toy card", memory_bytes=1_000_000, bandwidth=1000.0,
              flops={"fp32": 5e3, "bf16": 1e4, "fp16": 1e4}, efficiency=0.5, launch_s=1e-3)  # fmt: skip

# By hand. Per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192, gate/up/down 3 x 8 x 16 = 384: 576 multiplied
# weights; 2 norms of 8. Two layers: 1184. Embedding 80 + lm_head 80 + final norm 8: 1352 in all.
TOY_PARAMS = 2 * (576 + 16) + 80 + 80 + 8


def test_toy_parameter_count():
    assert TOY.num_parameters == TOY_PARAMS == 1352


def test_weight_bytes_per_dtype():
    assert roofline.weight_bytes(TOY, "bf16") == 2 * 1352
    assert roofline.weight_bytes(TOY, "fp32") == 4 * 1352
    # fp8 / int4 quantize the 1152 layer-matrix weights; embedding, lm_head, norms stay 2 bytes
    assert roofline.weight_bytes(TOY, "fp8") == 1152 * 1 + (1352 - 1152) * 2
    assert roofline.weight_bytes(TOY, "int4") == 1152 * (0.5 + 2 / 128) + (1352 - 1152) * 2


def test_a_step_streams_every_weight_but_the_embedding_table():
    assert roofline.streamed_weight_bytes(TOY, "bf16") == 2 * (1352 - 80)  # the 10 x 8 table is looked up
    tied = replace(TOY, tied_embeddings=True)  # lm_head multiplies through the shared table: all of it streams
    assert roofline.streamed_weight_bytes(tied, "bf16") == roofline.weight_bytes(tied, "bf16") == 2 * (1352 - 80)
    spec = load_spec("llama-3.1-8b")  # 16.06 GB in memory; the 128,256 x 4,096 bf16 table (1.05 GB) is not streamed
    assert roofline.streamed_weight_bytes(spec) == roofline.weight_bytes(spec) - 128256 * 4096 * 2 == 15_009_849_344
    one_row = 4096 * 2  # what a one-token step reads of the table
    assert roofline.decode_cost(spec, DEVICES["rtx-4090"], 1, 0).weight_bytes == 15_009_849_344 + one_row


def test_kv_bytes_per_token_counts_k_and_v_per_kv_head():
    assert roofline.kv_bytes_per_token(TOY, "bf16") == 2 * 2 * 1 * 4 * 2  # K and V x layers x kv heads x dim x bytes
    assert roofline.kv_bytes_per_token(TOY, "fp8") == 16


def test_gqa_shrinks_the_kv_cache():
    spec = load_spec("llama-3.1-8b")  # 32 query heads share 8 kv heads of 128
    assert roofline.kv_bytes_per_token(spec) == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert roofline.kv_bytes_per_token(spec) * 4 == 2 * 32 * 32 * 128 * 2  # what it would be without GQA


def test_one_decode_step_by_hand():
    cost = roofline.step_cost(TOY, CARD, [(1, 3)])  # one row, one new token after 3 cached
    # FLOPs: matmuls 2 x 1152 x 1 token; lm_head 2 x 10 x 8 at the row's last token;
    # attention 4 x layers 2 x heads 2 x dim 4 per key, and the new token sees 3 + 1 keys.
    assert cost.flops == 2 * 1152 + 2 * 10 * 8 + 4 * 2 * 2 * 4 * 4 == 2720
    # Weights: everything but the embedding table (2704 - 160), plus the one embedding row looked up (16).
    assert cost.weight_bytes == 2704 - 160 + 16
    assert cost.kv_read_bytes == 3 * 32 and cost.kv_write_bytes == 32
    # Activations: each matmul's input and output per layer: (8 + 16) + (8 + 8) + (8 + 32) + (16 + 8) = 104
    # values x 2 bytes x 2 layers; then 10 fp32 logits.
    assert cost.activation_bytes == 104 * 2 * 2 + 10 * 4
    bytes_ = 2560 + 96 + 32 + 456
    assert cost.bytes == bytes_
    assert cost.memory_s == pytest.approx(bytes_ / 1000) and cost.compute_s == pytest.approx(2720 / 1e4)
    assert cost.overhead_s == pytest.approx((10 * 2 + 4) * 1e-3)  # serving-engine kernels x 1 ms
    assert cost.time_s == pytest.approx(bytes_ / 1000 / 0.5 + 0.024)
    assert cost.bound == "memory" and cost.intensity == pytest.approx(2720 / bytes_)


def test_a_prefill_chunk_is_causal_within_itself():
    cost = roofline.step_cost(TOY, CARD, [(4, 2)])  # 4 new tokens after 2 cached: they see 3, 4, 5, 6 keys
    keys = 3 + 4 + 5 + 6
    assert cost.flops == 2 * 1152 * 4 + 2 * 10 * 8 + 4 * 2 * 2 * 4 * keys
    assert cost.kv_write_bytes == 4 * 32 and cost.kv_read_bytes == 2 * 32
    assert cost.activation_bytes == 104 * 2 * 2 * 4 + 10 * 4  # logits at the last token only


def test_rows_add_up():
    one, two = roofline.step_cost(TOY, CARD, [(1, 5)]), roofline.step_cost(TOY, CARD, [(1, 5), (1, 5)])
    assert two.flops == 2 * one.flops
    assert two.weight_bytes == one.weight_bytes + 16  # weights once per step; one more embedding row
    assert two.kv_read_bytes == 2 * one.kv_read_bytes


def test_a_gather_then_attend_implementation_moves_the_kv_three_times():
    kernels = roofline.Kernels(per_layer=0, per_step=100, kv_passes=3)
    cost = roofline.step_cost(TOY, CARD, [(1, 10)], kernels=kernels)
    assert cost.kv_read_bytes == 3 * 10 * 32 and cost.overhead_s == pytest.approx(0.1)


def test_decode_turns_compute_bound_at_the_ridge():
    card = replace(CARD, bandwidth=1e4)
    # Per row at context 0: 504 bytes (KV 32 + activations 456 + an embedding row 16) and 2304 + 160 + 64
    # = 2528 FLOPs (the new token attends to itself alone); once per step: 2544 bytes of weights.
    ridge = roofline.ridge_batch(TOY, card, context=0)
    assert ridge == pytest.approx((2544 / 1e4) / (2528 / 1e4 - 504 / 1e4))
    below = roofline.decode_cost(TOY, card, math.floor(ridge), 0)
    above = roofline.decode_cost(TOY, card, math.ceil(ridge), 0)
    assert below.bound == "memory" and above.bound == "compute"
    assert roofline.ridge_batch(TOY, CARD) is None  # at 1000 B/s a row's bytes outweigh its FLOPs


def test_at_long_context_decode_never_turns_compute_bound():
    # Each 4090 row at 4k context reads 512 MiB of KV (0.5 ms) for 17 GFLOP (0.1 ms): no batch is compute-bound.
    assert roofline.ridge_batch(load_spec("llama-3.1-8b"), DEVICES["rtx-4090"], context=4096) is None


def test_ridge_intensity_is_peak_over_bandwidth():
    assert roofline.ridge_intensity(DEVICES["rtx-4090"]) == pytest.approx(165.2e12 / 1008e9)
    assert roofline.ridge_intensity(DEVICES["h100-sxm"]) == pytest.approx(989.4e12 / 3.35e12)


# --- the cards ----------------------------------------------------------------------------------------
DENSE_BF16_TFLOPS = {"rtx-3090": 71, "rtx-4090": 165.2, "l4": 121, "a100-80gb-sxm": 312, "h100-sxm": 989.4,
                     "h200": 989.4, "apple-m2-ultra": 27.2, "dgx-spark": 62.5}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DENSE_BF16_TFLOPS))
def test_flops_are_dense_not_sparse(name):
    assert DEVICES[name].peak_flops("bf16") == pytest.approx(DENSE_BF16_TFLOPS[name] * 1e12)


def test_geforce_bf16_is_the_fp32_accumulate_rate():
    assert DEVICES["rtx-4090"].peak_flops("bf16") < 200e12  # not 330 (fp16 accumulate) nor 660 (that, sparse)
    assert DEVICES["rtx-3090"].peak_flops("bf16") < 100e12  # not 142 nor 284


def test_fp8_needs_fp8_tensor_cores():
    spec = load_spec("llama-3.1-8b")
    assert roofline.compute_dtype("fp8", DEVICES["rtx-3090"]) == "bf16"  # Ampere: weight-only fp8
    assert roofline.compute_dtype("fp8", DEVICES["h100-sxm"]) == "fp8"
    assert roofline.ridge_intensity(DEVICES["h100-sxm"], "fp8") == pytest.approx(2 * 989.4e12 / 3.35e12, rel=1e-3)
    assert roofline.weight_bytes(spec, "fp8") < roofline.weight_bytes(spec, "bf16")


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ConfigError, match="rtx-4090.*h200.*this-machine"):
        get_device("rtx-9090")


# --- the published check: Llama-3-8B bf16, one stream, llama.cpp ------------------------------------
# The figures and their source: bench/published.py PUBLISHED_SINGLE_STREAM (tg 512 from an empty context, so about
# 256 tokens of context on average). Llama-3-8B has Llama-3.1-8B's shapes (8,030,261,248 parameters).
@pytest.mark.parametrize("gpu,reported", PUBLISHED_SINGLE_STREAM.items())
def test_single_stream_8b_stays_under_the_bandwidth_ceiling_near_the_reports(gpu, reported):
    spec, card = load_spec("llama-3.1-8b"), DEVICES[gpu]
    predicted = 1 / roofline.decode_cost(spec, card, batch=1, context=256).time_s
    ceiling = card.bandwidth / roofline.streamed_weight_bytes(spec)  # 67.2 and 62.4 tokens/s
    assert predicted < ceiling
    assert predicted == pytest.approx(reported, rel=0.15)


# --- the KV ceiling -------------------------------------------------------------------------------------
def test_kv_ceiling_by_hand():
    # Reserve: 2048 tokens x 2 bytes x the MLP's live set (2 x 8 + 3 x 16 = 64 values) + 256 rows x 10 fp32 logits.
    reserve = 2048 * 2 * 64 + 256 * 10 * 4
    assert roofline.activation_reserve_bytes(TOY) == reserve
    free = 1_000_000 * 0.9 - 2704 - reserve  # 624,912 bytes
    assert roofline.free_kv_bytes(TOY, CARD) == pytest.approx(free)
    blocks = int(free // (16 * 32))  # blocks of 16 tokens x 32 bytes: 1220
    assert roofline.kv_blocks(TOY, CARD) == blocks == 1220
    assert roofline.max_users(TOY, CARD, context=100) == blocks // 7  # 100 tokens take 7 blocks
    assert roofline.max_context(TOY, CARD, users=10) == (blocks // 10) * 16
    assert roofline.max_users(TOY, CARD, context=100, kv_dtype="fp8") == int(free // (16 * 16)) // 7


def test_8b_on_a_4090_at_4k_context():
    spec, card = load_spec("llama-3.1-8b"), DEVICES["rtx-4090"]
    reserve = 2048 * 2 * (2 * 4096 + 3 * 14336) + 256 * 128256 * 4  # 341,049,344 bytes
    free = 24 * 2**30 * 0.9 - 8_030_261_248 * 2 - reserve  # about 6.8 GB left for KV
    blocks = int(free // (16 * 131072))
    assert roofline.max_users(spec, card, 4096) == blocks // 256 == 12
    assert roofline.max_users(spec, card, 4096, kv_dtype="fp8") == int(free // (16 * 65536)) // 256


def test_weights_that_do_not_fit_leave_no_kv():
    spec, card = load_spec("llama-3.1-70b"), DEVICES["rtx-4090"]
    assert roofline.free_kv_bytes(spec, card) < 0
    assert roofline.kv_blocks(spec, card) == 0 and roofline.max_users(spec, card, 1024) == 0


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: roofline.step_cost(TOY, CARD, []), "at least one row"),
        (lambda: roofline.step_cost(TOY, CARD, [(0, 5)]), "new_tokens >= 1"),
        (lambda: roofline.step_cost(TOY, CARD, [(1, 5)], dtype="int3"), "fp32, bf16, fp16, fp8, int4"),
        (lambda: roofline.step_cost(TOY, CARD, [(1, 5)], kv_dtype="int4"), "KV cache dtype"),
        (lambda: roofline.max_users(TOY, CARD, context=0), "at least 1"),
        (lambda: roofline.free_kv_bytes(TOY, CARD, utilization=1.5), "utilization"),
    ],
)
def test_bad_input_is_a_config_error(call, needle):
    with pytest.raises(ConfigError, match=needle):
        call()
