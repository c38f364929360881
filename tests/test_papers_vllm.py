"""The vLLM paper, reproduced (minillm/papers/vllm_*.py): the buddy allocator, the trace, the KV books' waste, the
sustained rates, the command. Small traces: seconds."""

from __future__ import annotations

import json

import pytest

from minillm.cli import main
from minillm.errors import ConfigError
from minillm.papers import vllm_setup as setup
from minillm.papers.vllm_buddy import BuddyAllocator, reservation
from minillm.papers.vllm_headlines import Span
from minillm.papers.vllm_memory import KINDS
from minillm.papers.vllm_paper import bench_for, capacity, run_system
from minillm.papers.vllm_trace import sharegpt_like


@pytest.fixture(scope="module")
def bench():
    return bench_for(setup.MODEL_CONFIG, setup.GPU, sharegpt_like(40, seed=3))


@pytest.fixture(scope="module")
def at_2(bench):
    return {key: run_system(setup.SYSTEMS[key], bench, 2.0) for key in ("orca-max", "orca-oracle", "vllm")}


def test_the_buddy_allocator_splits_and_merges():
    buddy = BuddyAllocator(961, 128)  # OPT-13B's pool on an A100 40GB: 961 blocks of 16 tokens, chunks up to 2048
    whole = [buddy.alloc(128) for _ in range(7)]
    assert None not in whole and buddy.alloc(128) is None  # 7 x 2048 tokens: the paper's Orca (Max) batches 7.00
    assert buddy.alloc(64) == 896 and buddy.alloc(64) is None and buddy.alloc(1) == 960
    buddy.free(whole[0], 128)
    halves = [buddy.alloc(64), buddy.alloc(64)]
    assert sorted(halves) == [0, 64] and buddy.alloc(32) is None  # split from the freed chunk, aligned
    for offset in halves:
        buddy.free(offset, 64)
    assert buddy.alloc(128) == 0  # the halves merged back into their chunk


def test_each_orca_reserves_as_the_paper_says():
    assert reservation(100, 25, "oracle") == 125
    assert reservation(100, 25, "pow2") == 132  # "if the true output length is 25, it reserves 32"
    assert reservation(100, 25, "max") == 2048
    assert reservation(1000, 1500, "pow2") == 2048  # never past the model's 2048 positions


def test_the_trace_is_sharegpt_sized_and_pruned_as_vllms_benchmark():
    trace = sharegpt_like(3000, seed=1)
    prompt, output = trace.means()
    assert prompt == pytest.approx(setup.MEAN_PROMPT, rel=0.1) and output == pytest.approx(setup.MEAN_OUTPUT, rel=0.1)
    assert all(4 <= p <= 1024 and o >= 4 and p + o <= 2048 for p, o in trace.lengths)
    assert trace.arrivals(2.0) == pytest.approx([t / 2 for t in trace.arrivals(1.0)])  # one draw, every rate


def test_paged_blocks_waste_little_and_contiguous_chunks_much(at_2):
    for run in at_2.values():
        assert sum(run.usage.values()) == pytest.approx(100)
        assert set(run.usage) == set(KINDS)
    vllm, orca_max, oracle = at_2["vllm"].usage, at_2["orca-max"].usage, at_2["orca-oracle"].usage
    held = vllm["token states"] + vllm["reservation"] + vllm["internal"]
    assert vllm["token states"] / held > 0.96  # only the last block's empty slots: under 4% of what it holds
    assert orca_max["token states"] < 35 and orca_max["internal"] > 35  # most of a 2048-token chunk is never used
    assert oracle["internal"] < 1 and oracle["external"] > 20  # the true length: no over-provisioning, buddy rounding
    assert orca_max["token states"] < oracle["token states"] < vllm["token states"]
    assert at_2["orca-max"].batched <= 7 < at_2["vllm"].batched


def test_vllm_sustains_more_than_orca(bench):
    slo = 0.03  # s/token: 40 requests load the card only so far (the default sample is 200)
    orca = capacity(setup.SYSTEMS["orca-max"], bench, slo, (0.5, None), factor=2.0)
    vllm = capacity(setup.SYSTEMS["vllm"], bench, slo, (2.0, None), factor=2.0)
    assert vllm.rate > 4 * orca.rate
    assert any(latency <= slo for _, latency in orca.tried) and any(latency > slo for _, latency in orca.tried)


def test_a_sample_too_small_to_load_the_card_says_so(bench):
    with pytest.raises(ConfigError, match="too few to load the card"):
        capacity(setup.SYSTEMS["vllm"], bench, 0.1, (2.0, None), factor=4.0)


def test_a_published_range_widens_by_35_percent():
    within = Span("vLLM over Orca", 1.7, 3.0, "x", "", "", high=2.7)
    assert within.ratio == pytest.approx(3.0 / 2.7) and within.verdict == "reproduced"
    assert Span("", 1.7, 2.2, "x", "", "", high=2.7).ratio == 1.0
    assert Span("", 1.7, 4.0, "x", "", "", high=2.7).verdict == "not reproduced"
    assert Span("", 0.0, 10.0, "x", "", "", high=22).verdict == "kept"  # "up to 22x"
    assert Span("", 0.0, 30.0, "x", "", "", high=22).verdict == "not kept"


def test_the_command_prints_the_memory_and_the_verdicts(capsys):
    assert main(["papers", "vllm", "--requests", "20", "--rate-only", "--system", "orca-max"]) == 0
    out = capsys.readouterr().out
    for expected in ("PagedAttention", "Orca (Max)", "vLLM", "token states", "(20.4)", "published", "verdict",
                     "20 ShareGPT-like requests", "assumptions"):  # fmt: skip
        assert expected in out, expected


def test_the_command_speaks_json(capsys):
    assert main(["papers", "vllm", "--requests", "16", "--rate-only", "--system", "orca-oracle", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["at_rate"]) == {"vllm", "orca-oracle"}  # vLLM always runs: every multiple is of it
    assert report["pool_tokens"] == 15_376 and report["capacity"] == {}
    verdicts = {h["name"]: h["verdict"] for h in report["headlines"]}
    assert "Orca (Oracle): KV memory holding token states" in verdicts
    assert set(verdicts.values()) <= {"reproduced", "not reproduced", "kept", "not kept"}


def test_bad_options_say_what_is_wrong(capsys):
    assert main(["papers", "vllm", "--requests", "5", "--rate-only"]) == 2
    assert "at least 10" in capsys.readouterr().err
    assert main(["papers", "vllm", "--gpu", "a200", "--rate-only", "--requests", "10"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["papers", "vllm", "--system", "orca-min"])


def test_the_papers_bench_runs_it():
    from minillm.bench import papers

    assert papers.PAPERS["vllm"] is papers.bench_vllm
