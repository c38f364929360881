"""The papers, reproduced (minillm/papers/): the Anyscale post's experiment on small crowds, its model and its card."""

from __future__ import annotations

import json

import pytest

from minillm.card.hardware import device_names, get_device
from minillm.card.modelspec import spec_from_config
from minillm.card.simulate import SimulatedRunner
from minillm.card.tensor_parallel import tp_step
from minillm.cli import main
from minillm.engine.request import Request
from minillm.papers.anyscale import Options, opt_13b, reply_lengths, sweep
from minillm.papers.anyscale_runner import Implementation, PricedRunner
from minillm.papers.quota import QuotaScheduler
from minillm.papers.verdict import Headline

GiB = 2**30


def test_opt_13b_has_its_13b_parameters():
    h, ffn, layers, vocab, positions = 5120, 20480, 40, 50272, 2048 + 2  # OPT's position table: 2 rows more
    attention = 4 * (h * h + h)  # q, k, v, out_proj, each with a bias
    mlp = (h * ffn + ffn) + (ffn * h + h)  # fc1, fc2 (ReLU between): two matrices, not SwiGLU's three
    layer_norms = 2 * 2 * h  # two LayerNorms a layer, a weight and a bias each
    by_hand = vocab * h + positions * h + layers * (attention + mlp + layer_norms) + 2 * h  # lm_head tied
    spec = opt_13b()
    assert spec.num_parameters == by_hand == 12_853_473_280
    assert spec.num_parameters == pytest.approx(12.85e9, rel=0.01)
    assert (spec.hidden, spec.layers, spec.heads, spec.intermediate, spec.vocab, spec.max_context) == (
        5120, 40, 40, 20480, 50272, 2048)  # fmt: skip


def test_a_plain_mlp_multiplies_through_two_matrices():
    sizes = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}
    gated = spec_from_config({**sizes, "intermediate_size": 256}, "llama-like")
    plain = spec_from_config({**sizes, "ffn_dim": 256, "model_type": "opt", "max_position_embeddings": 32}, "opt")
    assert not plain.gated_mlp and gated.gated_mlp
    assert gated.layer_matmul_params - plain.layer_matmul_params == 64 * 256  # one matrix fewer
    assert plain.active_matmul_params == 2 * (4 * 64 * 64 + 2 * 64 * 256)  # the FLOPs per token follow (2 each)
    assert plain.tied_embeddings and plain.position_embeddings == 34


def test_the_a100_40gb_is_a_card():
    assert "a100-40gb-sxm" in device_names()
    card = get_device("a100-40gb-sxm")
    assert (card.memory_bytes, card.bandwidth, card.peak_flops("fp16")) == (40 * GiB, 1555e9, 312e12)


def test_reply_lengths_are_a_capped_exponential():
    short, long = reply_lengths(2000, 32), reply_lengths(2000, 1536)
    assert 1 <= min(short) and max(short) <= 32 and max(long) <= 1536
    assert sum(long) / len(long) == pytest.approx(128, rel=0.1)  # a cap of 1536 barely cuts a mean of 128
    assert reply_lengths(50, 128, seed=3) == reply_lengths(50, 128, seed=3) != reply_lengths(50, 128, seed=4)


def test_no_costs_price_a_step_as_the_simulated_card_does():
    spec, card = opt_13b(), get_device("a100-40gb-sxm")
    rows = [(1, 700), (1, 900), (512, 0)]
    plain = SimulatedRunner(spec, card, "fp16", "fp16")
    priced = PricedRunner(spec, card, Implementation())
    assert priced.step_seconds(rows, {"a"}) == pytest.approx(tp_step(spec, card, rows, "fp16", "fp16").time_s)
    assert plain.pool_blocks(16) == priced.pool_blocks(16)
    hf = PricedRunner(spec, card, Implementation(kv_passes=3, padded=True))
    assert hf.step_seconds(rows, {"a"}) > priced.step_seconds(rows, {"a"})


def test_the_quota_admits_prompt_plus_max_new_tokens():
    waiting = [Request(f"r{i}", [5] * 512, 100) for i in range(4)]  # 612 tokens each
    plan = QuotaScheduler(1300).schedule(waiting, [None] * 8, kv=None)
    assert [r.id for r in plan.admit] == ["r0", "r1"]  # 1,224 fit; a third would need 1,836


def test_the_ratios_keep_the_posts_order():
    runs = sweep(Options(max_tokens=(1536,), requests=40))[1536]
    tokens_s = {key: run.tokens_s for key, run in runs.items()}
    assert tokens_s["vllm"] > tokens_s["continuous"] > tokens_s["ft"] > tokens_s["naive"]
    assert runs["naive"].seats == 4 and runs["continuous"].seats == 7  # the benchmark's batch; 7 rows of 2,048 fit


def test_the_command_prints_the_table_and_the_verdicts(capsys):
    assert main(["papers", "anyscale", "--requests", "24", "--max-tokens", "128", "1536"]) == 0
    out = capsys.readouterr().out
    for expected in ("max tokens", "naive static", "vLLM", "published", "reproduced", "verdict", "23x", "8x", "4x"):
        assert expected in out, expected


def test_a_missed_multiple_is_taken_apart_by_measurement(capsys):
    assert main(["papers", "anyscale", "--requests", "40", "--max-tokens", "1536", "--system", "continuous"]) == 0
    out = capsys.readouterr().out
    assert "not reproduced" in out  # 40 requests draw a short longest reply: naive static pads less
    for step in ("the mechanism alone", "as run", "admitted as TGI", "the draw", "still left", "40 requests"):
        assert step in out, step


def test_the_command_speaks_json(capsys):
    assert main(["papers", "anyscale", "--requests", "16", "--max-tokens", "1536", "--system", "vllm", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["runs"]["1536"]) == {"naive", "vllm"}  # naive static always runs: every multiple is over it
    verdicts = {h["name"]: h["verdict"] for h in report["headlines"]}
    assert verdicts and set(verdicts.values()) <= {"reproduced", "not reproduced", "kept", "not kept"}


def test_a_figure_within_35_percent_is_reproduced():
    close = Headline("x over y", 8.0, 10.7, "x", "", "")
    far = Headline("x over y", 8.0, 11.5, "x", "", "")
    assert close.verdict == "reproduced" and far.verdict == "not reproduced"
    assert Headline("bound", 2.0, 2.1, "x", "", "", at_least=True).verdict == "kept"


def test_bad_options_say_what_fits(capsys):
    assert main(["papers", "anyscale", "--max-tokens", "2000", "--requests", "4"]) == 2
    assert "1 to 1536 tokens" in capsys.readouterr().err
    assert main(["papers", "anyscale", "--static-batch", "64", "--max-tokens", "1536", "--requests", "4"]) == 2
    assert "at most 7" in capsys.readouterr().err


def test_the_papers_bench_entry_reports_each_figure(monkeypatch):
    from types import SimpleNamespace

    from minillm.bench import papers
    from minillm.bench.report import markdown
    from minillm.bench.suite import BENCHES

    assert BENCHES["papers"] is papers.bench_papers and "anyscale" in papers.PAPERS
    other = {"headlines": [{"verdict": "reproduced"}, {"verdict": "not reproduced"}]}  # (a second paper, made up)
    monkeypatch.setattr(papers, "PAPERS", {"anyscale": papers.bench_anyscale, "other": lambda q: (other, "OTHER")})
    monkeypatch.setattr(papers, "QUICK_REQUESTS", 40)  # (a small sample: seconds)
    r = papers.bench_papers(None, SimpleNamespace(quick=True))
    reproduced = sum(h["verdict"] in ("reproduced", "kept") for h in r["anyscale"]["headlines"])
    assert r["headlines"] == len(r["anyscale"]["headlines"]) + 2 and r["reproduced"] == reproduced + 1
    text = markdown({"machine": "m", "device": "cpu", "date": "d", "papers": r}, "python -m minillm bench", "plots")
    assert "## 23. The papers, reproduced" in text and "40 requests of 512 prompt tokens" in text
    assert "OTHER" in text and "(2 papers)" in text


def test_a_papers_run_saves_traces_the_step_player_replays(tmp_path, capsys):
    from minillm.runs import trace_file
    from viz.app.trace_files import load_uploaded_trace

    args = ["--requests", "40", "--max-tokens", "128", "--system", "vllm", "--save-traces", str(tmp_path)]
    assert main(["papers", "anyscale", *args]) == 0
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved == ["anyscale-max128-naive.json", "anyscale-max128-vllm.json"]
    for name in saved:
        data = (tmp_path / name).read_bytes()
        trace = load_uploaded_trace(data)
        assert not isinstance(trace, str), trace  # (a reason why not, were it refused)
        assert (
            len(trace.requests) == 40 and trace.config["gpu"] == "a100-40gb-sxm" and trace.config["model"] == "opt-13b"
        )
        assert trace_file.loads(data).config["workload"].startswith("anyscale")
    naive, vllm = (trace_file.load(tmp_path / name) for name in saved)
    assert max(len(s.seats) for s in naive.steps) == 12  # the benchmark's static batch at max 128
    assert len(vllm.steps) < len(naive.steps)  # the same crowd in fewer steps


SMALL_RUNS = [["sglang", "--workload", "chat-short", "--requests", "3"],
              ["vllm", "--rate-only", "--requests", "12", "--system", "vllm", "orca-max"],
              ["distserve", "--app", "figure-1", "--requests", "10", "--system", "distserve"]]  # fmt: skip


@pytest.mark.parametrize("paper", SMALL_RUNS)
def test_every_papers_runs_can_be_saved_for_the_step_player(paper, tmp_path, capsys):
    from viz.app.trace_files import load_uploaded_trace

    assert main(["papers", *paper, "--save-traces", str(tmp_path)]) == 0
    saved = sorted(tmp_path.iterdir())
    assert saved and f"{len(saved)} traces written" in capsys.readouterr().err
    for path in saved:
        assert path.name.startswith(paper[0]) and path.suffix == ".json"
        trace = load_uploaded_trace(path.read_bytes())
        assert not isinstance(trace, str), trace
        assert trace.steps and all(r.finish_reason for r in trace.requests)  # whole runs, every request served
