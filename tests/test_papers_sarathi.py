"""Sarathi-Serve, reproduced (minillm/papers/sarathi*.py): the crowd, the two schedulers, the capacity search, the
command."""

from __future__ import annotations

import json

import pytest

from minillm.cli import main
from minillm.papers import sarathi_setup as setup
from minillm.papers.sarathi import Options, Watch, make_runner, run_point, scheduler_of, search_capacity
from minillm.papers.sarathi_crowd import Crowd, draw_crowd, median, percentile
from minillm.papers.sarathi_report import account_text, headlines

CHAT = setup.TRACES["openchat_sharegpt4"]
MISTRAL = setup.DEPLOYMENTS["mistral-7b"]


def test_the_sampled_crowd_has_table_2s_lengths():
    crowd = draw_crowd(CHAT, 3000, seed=0)
    assert median(crowd.prompts) == pytest.approx(1730, rel=0.1)
    assert percentile(crowd.prompts, 90) == pytest.approx(5696, rel=0.1)
    assert median(crowd.outputs) == pytest.approx(415, rel=0.1)
    assert percentile(crowd.outputs, 90) == pytest.approx(834, rel=0.1)
    assert max(p + o for p, o in zip(crowd.prompts, crowd.outputs)) <= 8192  # the paper's filter
    assert crowd.arrivals(2.0)[-1] == pytest.approx(crowd.arrivals(1.0)[-1] / 2)  # the same crowd, closer together


def steps_of(system: str, crowd: Crowd, rate: float, budget: int = 512):
    """The kinds of rows and the tokens of every step of one run."""
    from minillm.config import EngineConfig
    from minillm.engine.engine import Engine
    from minillm.engine.request import Request

    runner = make_runner(MISTRAL)
    cfg = EngineConfig(slots=setup.MAX_SEATS, num_blocks=runner.pool_blocks(16), max_len=runner.max_len,
                       record_blocks=False)  # fmt: skip
    engine, seen = Engine(runner, scheduler_of(system, budget, CHAT), cfg), []
    engine.observers.append(lambda e, step: seen.append((set(step.kinds.values()), sum(n for _, n in step.rows))))
    engine.observers.append(Watch())
    for i, (p, o, t) in enumerate(zip(crowd.prompts, crowd.outputs, crowd.arrivals(rate))):
        engine.submit(Request(f"r{i}", [5] * p, o, ignore_eos=True, arrival_s=t))
    engine.run()
    return seen


def test_vllm_never_mixes_and_sarathi_keeps_to_its_budget():
    crowd = draw_crowd(CHAT, 12, seed=1)
    vllm, sarathi = steps_of("vllm", crowd, 4.0), steps_of("sarathi", crowd, 4.0)
    assert all(len(kinds) == 1 for kinds, _ in vllm)  # a prompt step or a decode step, never both
    assert max(tokens for _, tokens in vllm) > 512  # whole prompts
    assert all(tokens <= 512 for _, tokens in sarathi)
    assert any(kinds == {"prefill", "decode"} for kinds, _ in sarathi)  # chunks ride with the decodes


def test_chunked_prefill_keeps_the_tail_between_tokens_short_at_the_same_rate():
    crowd = draw_crowd(CHAT, 40, seed=0)
    vllm = run_point(MISTRAL, "vllm", 512, CHAT, crowd, 2.0, 0.1)
    sarathi = run_point(MISTRAL, "sarathi", 512, CHAT, crowd, 2.0, 0.1)
    assert sarathi.p99_tbt_s < 0.1 < vllm.p99_tbt_s  # the generation stalls: a whole prompt between two tokens
    assert sarathi.stalls == 0 < vllm.stalls


def test_the_search_finds_the_highest_rate_that_meets():
    def meets_at(rate):
        return None, rate <= 2.3

    rate, points, bounded = search_capacity(meets_at, 1.0)
    assert 2.3 * 0.95 <= rate <= 2.3 and len(points) < 10 and bounded
    assert search_capacity(lambda r: (None, r <= 0.2), 1.0)[0] == pytest.approx(0.2, rel=0.05)  # halving first
    assert search_capacity(lambda r: (None, False), 1.0)[0] == 0.0
    assert search_capacity(lambda r: (None, True), 1.0)[::2] == (64.0, False)  # never missed: only a floor


def test_a_headline_only_where_the_paper_states_one():
    from minillm.papers.sarathi import Capacity

    found = {"vllm": Capacity("vllm", 1.0), "sarathi": Capacity("sarathi", 2.5)}
    assert not headlines(Options(), found | {"sarathi": Capacity("sarathi", 9.0, bounded=False)})
    (h,) = headlines(Options(), found)
    assert (h.published, h.reproduced, h.verdict) == (2.6, 2.5, "reproduced")
    assert headlines(Options(slo="0.1"), found)  # the strict SLO in seconds is the same point
    assert not headlines(Options(slo="relaxed"), found) and not headlines(Options(slo="0.3"), found)


def test_a_missed_headline_is_taken_apart():
    text = account_text({"headline": "Sarathi-Serve over vLLM", "mechanism": {"vllm": 2.0, "sarathi": 2.0},
                         "mechanism_ratio": 1.0, "with_host_overhead": {"vllm": 1.0, "sarathi": 1.8},
                         "with_host_overhead_ratio": 1.8, "overhead_ms": {"fixed": 1.6, "per_sequence": 0.17},
                         "source": "vidur", "published": 2.6})  # fmt: skip
    assert "the mechanism alone" in text and "1.80x, within 35%" in text and "(closer)" in text


def test_the_command_prints_the_search_and_speaks_json(capsys):
    assert main(["papers", "sarathi", "--requests", "24", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["capacities"]) == {"vllm", "sarathi"}
    assert all(c["points"] for c in report["capacities"].values())
    (h,) = report["headlines"]
    assert h["published"] == 2.6 and h["verdict"] in ("reproduced", "not reproduced")
    assert main(["papers", "sarathi", "--requests", "8", "--system", "vllm", "--slo", "relaxed"]) == 0
    out = capsys.readouterr().out
    for expected in ("Sarathi-Serve", "capacity", "500 ms (relaxed)", "budget 2048", "rates tried", "Table 2"):
        assert expected in out, expected


def test_bad_options_say_what_is_allowed(capsys):
    assert main(["papers", "sarathi", "--slo", "fast", "--requests", "16"]) == 2
    assert "strict, relaxed or a P99 TBT in seconds" in capsys.readouterr().err
    assert main(["papers", "sarathi", "--requests", "4"]) == 2
    assert "at least 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["papers", "sarathi", "--start-rate", "0"])
    assert "above 0" in capsys.readouterr().err


def test_the_papers_bench_entry_names_sarathi():
    from minillm.bench import papers

    assert papers.PAPERS["sarathi"] is papers.bench_sarathi
