"""bench's peer entry (minillm/bench/peer.py): minillm against vLLM on the same CPU. vLLM is no minillm dependency:
without MINILLM_VLLM_PYTHON the entry says so and the test that drives vLLM is skipped."""

from __future__ import annotations

import os
import tempfile

import pytest

from minillm.bench.common import BenchSettings
from minillm.bench.peer import ENV, bench_peer, markdown, minillm_run, take_turns
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
    assert "forward" in "\n".join(markdown({"repeats": 1, "requests": 6, "4-eager": result}))


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
