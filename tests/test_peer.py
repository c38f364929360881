"""bench's peer entry (minillm/bench/peer.py): minillm against vLLM on the same CPU. vLLM is no minillm dependency:
without MINILLM_VLLM_PYTHON the entry says so and the test that drives vLLM is skipped."""

from __future__ import annotations

import os
import tempfile

import pytest

from minillm.bench.common import BenchSettings
from minillm.bench.peer import ENV, bench_peer, markdown, minillm_run, take_turns
from minillm.bench.peer_profile import PARTS, minillm_profiled, part_of, parts_per_step
from minillm.bench.peer_server import MINILLM, agree, serve_turns
from minillm.bench.peer_server import markdown as server_markdown
from minillm.model.tokenizer import EOS
from minillm.runs.run import run_workload
from minillm.runs.workload import ChatKnobs
from minillm.serving.export import export_llama
from tests.conftest import one_torch_thread

SMALL = {"workload": "chat", "knobs": ChatKnobs(requests=6, rate=1000, mean_reply=20), "seed": 23}


def test_without_vllm_the_entry_says_how_to_get_it(shipped_model, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    result = bench_peer(shipped_model, BenchSettings(quick=True))
    assert "skipped" in result and ENV in result["skipped"]
    assert result["skipped"] in "\n".join(markdown(result))


def test_minillms_step_split_adds_up_and_changes_no_token(shipped_model):
    with one_torch_thread():
        run = minillm_run(shipped_model, 4, SMALL)
        plain = run_workload(shipped_model, "chat", "continuous", slots=4, knobs=SMALL["knobs"], seed=23)
    split = run["split"]
    assert split["forward_s"] > 0 and split["pick_s"] > 0 and split["rest_s"] > 0
    assert sum(split.values()) == pytest.approx(run["seconds"])
    assert split["forward_s"] < run["seconds"]
    assert run["steps"] == len(plain.steps) and run["replies"] == [r.output_ids for r in plain.requests]
    assert not shipped_model._forward_hooks and not shipped_model._forward_pre_hooks  # (the hooks are removed)


@pytest.mark.skipif(not os.environ.get(ENV), reason=f"no vLLM here: set {ENV} (vLLM is no minillm dependency)")
def test_vllm_serves_the_export_with_the_same_tokens_and_steps(shipped_model):
    with one_torch_thread(), tempfile.TemporaryDirectory() as folder:
        export_llama(shipped_model, folder)
        result = take_turns(shipped_model, os.environ[ENV], folder, 4, "eager", 1, SMALL)
    assert result["identical_replies"] == SMALL["knobs"].requests
    assert result["minillm"]["steps"] == result["vllm_run"]["steps"]
    assert result["minillm"]["tokens_per_s"] > 0 and result["vllm_run"]["tokens_per_s"] > 0
    theirs = result["vllm_run"]["split_ms_per_step"]  # (vLLM's step split by the same hooks as minillm's)
    assert theirs["forward_s"] > 0 and theirs["pick_s"] > 0 and theirs["rest_s"] > 0
    assert result["profile"]["vllm"]["matmuls"] > 0 and result["profile"]["vllm"]["attention"] > 0
    text = "\n".join(markdown({"repeats": 1, "requests": 6, "4-eager": result}))
    assert "forward" in text and "Where the gap is" in text


def test_each_sides_ops_fall_in_the_right_part():
    for op in ("mkldnn::_linear_pointwise", "_C::onednn_mm", "aten::addmm"):
        assert part_of(op) == "matmuls", op
    for op in (
        "minillm::cached_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::index_select",
        "_C::cpu_attention_with_kv_cache",
        "vllm::unified_kv_cache_update",
        "_C::cpu_attn_reshape_and_cache",
    ):
        assert part_of(op) == "attention", op  # fmt: skip
    assert part_of("## Call CompiledFxGraph None ##") == "fused by the compiler"
    assert part_of("aten::rms_norm") == part_of("aten::argmax") == "other torch ops"
    parts = parts_per_step({"aten::mm": 0.2, "aten::index_select": 0.1, "aten::mul": 0.05}, seconds=0.5, steps=10)
    assert parts == pytest.approx({"matmuls": 20, "attention": 10, "fused by the compiler": 0, "other torch ops": 5,
                                   "not in any op": 15})  # fmt: skip


def test_minillms_profiled_run_finds_its_matmuls_and_attention(shipped_model):
    with one_torch_thread():
        profiled = minillm_profiled(lambda around: minillm_run(shipped_model, 4, SMALL, around))
    parts = parts_per_step(profiled["ops"], profiled["seconds"], profiled["steps"])
    assert set(parts) == set(PARTS) and parts["matmuls"] > 0 and parts["attention"] > 0
    assert sum(parts.values()) == pytest.approx(1000 * profiled["seconds"] / profiled["steps"])


def test_replies_agree_up_to_vllms_first_eos():
    """With ignore_eos, minillm never picks EOS while vLLM may pick it and go on: they agree up to there."""
    assert agree([5, 6, 7], [5, 6, 7])
    assert agree([5, 6, 9, 4], [5, 6, EOS, 2])  # (parted at vLLM's EOS)
    assert not agree([5, 8, 9, 4], [5, 6, EOS, 2])  # parted before it
    assert not agree([5, 6], [5, 6, 7])  # not the same length


@pytest.mark.skipif(not os.environ.get(ENV), reason=f"no vLLM here: set {ENV} (vLLM is no minillm dependency)")
def test_minillms_servers_and_vllms_take_turns_on_the_same_users(shipped_model):
    with tempfile.TemporaryDirectory() as folder:
        export_llama(shipped_model, folder)
        result = serve_turns(os.environ[ENV], folder, seats=4, repeats=1, requests=8)
    for name in (*MINILLM, "vllm"):
        assert result[name]["errors"] == 0 and result[name]["tokens_per_s"] > 0
        assert result[name]["same_tokens"] == 8
    text = "\n".join(server_markdown(result))
    assert "`minillm serve --compile`" in text and "vLLM's server" in text
