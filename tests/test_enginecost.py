"""A serving engine's step, phase by phase, against the roofline's bound; and real cards against published figures."""

import pytest

from minillm.bench.published import FIGURES, GOALS, PUBLISHED_SINGLE_STREAM, predict
from minillm.card import roofline
from minillm.card.enginecost import COMPUTE_EFFICIENCY, engine_step
from minillm.card.hardware import DEVICES, Device
from minillm.card.modelspec import ModelSpec, load_spec
from minillm.errors import ConfigError

TOY = ModelSpec("toy", hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4, vocab=10)
# 1000 bytes/s at 50% in practice, 10^4 bf16 FLOP/s, 1 ms a kernel (tests/test_roofline.py's toy card).
CARD = Device("toy-card", "toy card", memory_bytes=1_000_000, bandwidth=1000.0,
              flops={"fp32": 5e3, "bf16": 1e4, "fp16": 1e4}, efficiency=0.5, launch_s=1e-3)  # fmt: skip


def test_a_step_is_its_matmuls_then_its_attention_by_hand():
    step = engine_step(TOY, CARD, [(1, 3)])  # tests/test_roofline.py works this step's bytes and FLOPs out
    # matmuls: weights 2544 + embedding row 16 + activations 456 bytes; 2304 + 160 FLOPs
    assert step.matmul_s == pytest.approx(max((2544 + 16 + 456) / 500, (2304 + 160) / (1e4 * 0.72)))
    # attention: 3 cached tokens read + 1 written, 32 bytes each; 4 x 2 layers x 2 heads x 4 x 4 keys FLOPs
    assert step.attention_s == pytest.approx(max(4 * 32 / 500, 256 / (1e4 * 0.72)))
    assert step.overhead_s == pytest.approx(24e-3)
    assert step.matmul_bound == step.attention_bound == "memory"


def test_decode_at_batch_1_is_the_bound():
    """Memory-bound in both phases: the sum of the two phases' bytes is the bound's bytes."""
    spec, card = load_spec("llama-3.1-8b"), DEVICES["rtx-4090"]
    for context in (0, 1024, 32768):
        bound = roofline.decode_cost(spec, card, 1, context).time_s
        assert engine_step(spec, card, [(1, context)]).time_s == pytest.approx(bound)


def test_a_big_batch_pays_for_compute_and_for_its_kv_one_after_the_other():
    spec, card = load_spec("llama-2-7b"), DEVICES["h100-sxm"]
    rows = [(1, 192)] * 768  # TensorRT-LLM's batch 768, half way through 128 tokens after a 128-token prompt
    step, bound = engine_step(spec, card, rows, "fp8", "fp8"), roofline.step_cost(spec, card, rows, "fp8", "fp8")
    assert step.matmul_bound == "compute" and step.attention_bound == "memory"
    # 36 GiB of KV read at 85% of 3.35 TB/s (13.6 ms) after 10 TFLOP of fp8 matmuls at 61% of peak (8.4 ms): the
    # bound overlaps the two (17.8 ms), the card cannot (22.7 ms)
    assert step.attention_s == pytest.approx((bound.kv_read_bytes + bound.kv_write_bytes) / (3.35e12 * 0.85))
    assert step.time_s > bound.time_s * 1.2


def test_the_efficiency_of_a_dtype_is_its_published_share_of_peak():
    assert COMPUTE_EFFICIENCY["bf16"] == pytest.approx(225 / 312, abs=0.005)  # FlashAttention-2 on an A100
    assert COMPUTE_EFFICIENCY["fp8"] == pytest.approx(1200 / 1978.9, abs=0.005)  # FlashAttention-3, H100 SXM


@pytest.mark.parametrize("rows", [[], [(0, 4)], [(1, -1)]])
def test_bad_rows_are_a_config_error(rows):
    with pytest.raises(ConfigError, match="row"):
        engine_step(TOY, CARD, rows)


# --- the published figures -------------------------------------------------------------------------------------
def test_every_figure_names_its_source_and_the_table_spans_three_cards():
    assert len(FIGURES) >= 10 and all(f.source for f in FIGURES)
    assert len({f.gpu for f in FIGURES}) >= 3 and {f.kind for f in FIGURES} == set(GOALS)
    assert PUBLISHED_SINGLE_STREAM == {"rtx-4090": 54.84, "rtx-3090": 47.40}


@pytest.mark.parametrize("figure", [f for f in FIGURES if f.kind == "decode" and f.model == "llama-3.1-8b"],
                         ids=lambda f: f"{f.gpu} {f.label}")  # fmt: skip
def test_single_stream_decode_lands_within_its_goal(figure):
    """A dense model's one stream (the mixtures of experts' rows: tests/test_published_moe.py)."""
    predicted, run = predict(figure)
    assert run["summary"]["output_tokens"] == figure.reply  # the run generated what the benchmark generated
    assert predicted == pytest.approx(figure.reported, rel=GOALS["decode"])
