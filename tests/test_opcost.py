"""The op-by-op predictor's arithmetic by hand on a made-up calibration, the call counts it is priced by, and the
model sizes it is checked on."""

from dataclasses import replace

import pytest
import torch

from minillm.card import opcost
from minillm.card.measure import calls_for_layers, step_calls
from minillm.card.modelspec import ModelSpec, load_spec
from minillm.card.sizes import SIZES, size_spec, timing_model
from minillm.config import ModelConfig
from minillm.errors import ConfigError
from minillm.model.transformer import Transformer

# A made-up machine, in round numbers: matmuls of 1 row at 10 GFLOP/s, of 2 at 20, of 4 and more at 40; a 1-row
# matmul reads its matrices at 20 GB/s from working sets up to 8 MiB, at 5 GB/s from 64 MiB and more; attention:
# 2 us a row beyond its bytes (the first two points hold the same bytes in 128 rows and in 8), then 1 ns a byte;
# elementwise at 10 GB/s; 4 us a call in the tiny-op mix (the roofline's launch cost), 5 us per call of minillm's
# own step (the predictor's).
CAL = {
    "device": "cpu",
    "cache_bytes": 2**20,
    "launch_s": 4e-6,
    "call_s": 5e-6,
    "rows_flops": {"512x1408": {"1": 10e9, "2": 20e9, "4": 40e9, "512": 40e9}},
    "stream_bandwidth": {"1048576": 20e9, "8388608": 20e9, "67108864": 5e9},  # 20 GB/s in the cache, then 5
    "stream_by_shape": {"512x1408": 5e9},  # from memory, every matrix size (one measured)
    "attention": {  # measured with the toy's head shape (2 query heads, 1 kv head of 4): "2x1x4"
        "2x1x4": [
            {"sequences": 128, "cached": 15, "chunk": 1, "kv_bytes": 1e6, "flops": 0, "seconds": 128 * 2e-6 + 1e-3},
            {"sequences": 8, "cached": 255, "chunk": 1, "kv_bytes": 1e6, "flops": 0, "seconds": 8 * 2e-6 + 1e-3},
            {"sequences": 64, "cached": 511, "chunk": 1, "kv_bytes": 1e8, "flops": 0, "seconds": 64 * 2e-6 + 0.1},
            {"sequences": 1, "cached": 0, "chunk": 64, "kv_bytes": 1e5, "flops": 1e9, "seconds": 0.1},
        ],
    },
    "elementwise_bandwidth": {"1024": 10e9, "1048576": 10e9},
}
CAL["attention"]["16x4x64"] = [dict(p) for p in CAL["attention"]["2x1x4"]]  # another shape (the same numbers)
SHAPE = (512, 1408)
# 1 layer, residual 8, MLP 16, 2 query heads sharing 1 kv head of 4, vocabulary 10.
TOY = ModelSpec("toy", hidden=8, intermediate=16, layers=1, heads=2, kv_heads=1, head_dim=4, vocab=10)


def test_matmul_flops_follow_the_rows_between_measured_points():
    assert opcost.matmul_flops(CAL, 1, SHAPE) == pytest.approx(10e9)
    assert opcost.matmul_flops(CAL, 4, SHAPE) == pytest.approx(40e9)
    # on the log-log line from (2 rows, 20 GFLOP/s) to (4, 40): the rate doubles with the rows, so 3 rows get 30
    assert opcost.matmul_flops(CAL, 3, SHAPE) == pytest.approx(30e9)
    assert opcost.matmul_flops(CAL, 4096, SHAPE) == pytest.approx(40e9)  # past the measured rows: the last rate


def test_matmul_flops_follow_the_matrix_size_between_measured_sizes():
    two = CAL | {"rows_flops": {"100x100": {"1": 1e9, "8": 1e9}, "400x400": {"1": 4e9, "8": 16e9}}}
    assert opcost.matmul_flops(two, 1, (200, 200)) == pytest.approx(2e9)  # 4x the weights of one, 1/4 of the other
    assert opcost.matmul_flops(two, 8, (200, 200)) == pytest.approx(4e9)
    assert opcost.matmul_flops(two, 1, (10, 10)) == pytest.approx(1e9)  # smaller than measured: the smallest's rate


def test_one_decode_step_by_hand():
    bill = opcost.step_bill(TOY, CAL, [(1, 15)], calls=100)
    # matmuls: q 8x8, k 8x4, v 8x4, o 8x8, gate 8x16, up 8x16, down 16x8 = 576 weights, 2 FLOPs each, 1 row at
    # 10 GFLOP/s; lm_head 8x10 likewise.
    assert bill.matmul_s == pytest.approx((2 * 576 + 2 * 80) / 10e9)
    assert bill.stream_s == 0  # 656 weights x 4 bytes: a working set the cache holds
    # attention: 1 row (2 us) + 16 keys x (k and v) x 4 values x 4 bytes = 512 bytes at 1 ns a byte
    assert bill.attention_s == pytest.approx(2e-6 + 512 * 1e-9)
    # elementwise: 20 x 8 + 11 x 8 + 13 x 4 + 5 x 16 = 380 floats a token, 4 bytes each, at 10 GB/s
    assert bill.elementwise_s == pytest.approx(380 * 4 / 10e9)
    assert bill.calls_s == pytest.approx(100 * 5e-6)
    assert bill.time_s == pytest.approx(sum(bill.terms().values()))  # on a CPU the terms add up
    assert bill.dominant == "calls"


def test_weights_beyond_the_cache_are_streamed_at_the_extra_cost_of_memory():
    big = replace(TOY, name="big", hidden=2048, intermediate=8192)  # 50 M weights: 201 MB, past 64 MiB
    bill = opcost.step_bill(big, CAL, [(1, 15)], calls=0)
    weights = big.layer_matmul_params + big.vocab * big.hidden
    assert bill.stream_s == pytest.approx(weights * 4 * (1 / 5e9 - 1 / 20e9))


def test_a_working_set_part_way_past_the_cache_streams_part_of_the_way():
    # 1/rate by working set: 1/20e9 at 8 MiB, 1/5e9 at 64 MiB, log-log between: 1/10e9 at the geometric middle
    middle = 2 ** ((23 + 26) / 2)
    assert opcost.streamed_share(CAL, middle) == pytest.approx((1 / 10e9 - 1 / 20e9) / (1 / 5e9 - 1 / 20e9))
    assert opcost.streamed_share(CAL, 2**20) == 0 and opcost.streamed_share(CAL, 2**30) == 1


def test_the_kv_cache_a_step_reads_pushes_the_weights_out_of_the_cache():
    one, many = (opcost.step_bill(TOY, CAL, [(1, 4000)] * rows, calls=0) for rows in (1, 2000))
    assert one.stream_s == 0 and many.stream_s > 0  # 2000 rows x 4000 keys x 32 bytes x 2: past 64 MiB
    weights = (TOY.layer_matmul_params + TOY.vocab * TOY.hidden) * 4
    assert many.stream_s == pytest.approx(weights * (1 / 5e9 - 1 / 20e9))


def test_a_prompt_chunk_prices_its_attention_flops():
    bill = opcost.step_bill(TOY, CAL, [(64, 0)], calls=0, logits_rows=1)
    flops = 4 * 64 * 64 * 2 * 4  # every query against every key of its chunk (masked ones too), 2 heads of 4
    assert bill.attention_s == pytest.approx(max(2e-6 + 64 * 32 * 1e-9, flops * 0.1 / 1e9))
    assert bill.matmul_s == pytest.approx(2 * 576 * 64 / 40e9 + 2 * 80 / 10e9)  # 64 rows; logits at 1


def test_attention_is_priced_from_the_nearest_head_shape_measured():
    assert opcost.attention_points(CAL, TOY) is CAL["attention"]["2x1x4"]
    wide = replace(TOY, heads=16, kv_heads=4, head_dim=64)
    assert opcost.attention_points(CAL, wide) is CAL["attention"]["16x4x64"]
    assert opcost.attention_points(CAL, replace(TOY, head_dim=8)) is CAL["attention"]["2x1x4"]


def test_rows_of_equal_length_attend_together_padded_to_the_longest():
    assert opcost.groups_of([(1, 10), (1, 40), (5, 0)]) == [(2, 1, 41), (1, 5, 5)]


def test_a_gpu_overlaps_the_calls_with_the_work():
    gpu = CAL | {"device": "cuda"}
    few, many = (opcost.step_bill(TOY, gpu, [(1, 15)], calls) for calls in (0, 10_000))
    assert few.time_s == pytest.approx(few.work_s) and many.time_s == pytest.approx(many.calls_s)


def test_more_calls_cost_more_and_the_count_is_never_assumed():
    one, two = (opcost.step_bill(TOY, CAL, [(1, 15)], calls) for calls in (300, 600))
    assert two.calls_s == pytest.approx(2 * one.calls_s) and two.work_s == one.work_s


@pytest.mark.parametrize(
    "rows,cal,needle",
    [([], CAL, "rows"), ([(0, 5)], CAL, "rows"), ([(1, 5)], {"device": "cpu"}, "calibrate")],
)
def test_bad_input_is_a_config_error(rows, cal, needle):
    with pytest.raises(ConfigError, match=needle):
        opcost.step_bill(TOY, cal, rows, calls=1)


# --- the calls, counted on the real forward ------------------------------------------------------------------
class OneMoreCallPerLayer(Transformer):
    """A model whose layers each make one torch call more (a stand-in for any change to the forward)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        for layer in self.layers:
            forward = layer.forward
            layer.forward = lambda x, cos, sin, cache, forward=forward: forward(x, cos, sin, cache) * 1.0


def test_calls_are_counted_on_the_forward_that_runs():
    cfg = ModelConfig(dim=16, n_layers=3, n_heads=2, n_kv_heads=1, ffn_dim=16, max_seq_len=64)
    plain, more = Transformer(cfg).eval(), OneMoreCallPerLayer(cfg).eval()
    assert step_calls(more, 2, 8) == step_calls(plain, 2, 8) + 3


def test_the_count_depends_on_depth_not_width():
    wide = Transformer(ModelConfig(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=64)).eval()
    assert calls_for_layers(3, batch=2, context=8) == step_calls(wide, 2, 8)
    assert calls_for_layers(6) > calls_for_layers(3)


# --- the sizes ---------------------------------------------------------------------------------------------------
def test_the_smallest_size_is_the_shipped_shape():
    assert SIZES["3m"] == ModelConfig()
    shipped = load_spec("minillm-tiny")
    assert replace(size_spec("3m"), name=shipped.name) == shipped


def test_the_larger_sizes_meet_the_memory_wall_of_a_32_mib_cache():
    weights = {name: size_spec(name).num_parameters * 4 for name in SIZES}  # fp32 bytes
    assert weights["3m"] < 32 * 2**20 / 2  # 12 MB: fits with room to spare
    assert weights["25m"] > 3 * 32 * 2**20 and weights["100m"] > 12 * 32 * 2**20


def test_a_timing_model_is_the_engine_transformer_with_random_weights():
    model = timing_model("25m")
    assert type(model) is Transformer and model.cfg == SIZES["25m"] and not model.training
    assert model.num_parameters() == size_spec("25m").num_parameters
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 260)
    with pytest.raises(ConfigError, match="3m, 25m, 100m"):
        size_spec("7b")
