"""Orca, reproduced (minillm/papers/orca*.py): the trace, the two schedulers, the capacity, the command."""

from __future__ import annotations

import json

import pytest

from minillm.cli import main
from minillm.papers import orca_setup as setup
from minillm.papers.orca import Capacity, Costs, Options, draw_crowd, run_point, serve
from minillm.papers.orca_report import account_text, headlines

GPT3 = setup.DEPLOYMENTS["gpt3-175b"]


def test_the_trace_is_the_papers_uniforms():
    crowd = draw_crowd(2000, seed=1)
    assert min(crowd.prompts) == 32 and max(crowd.prompts) == 512
    assert min(crowd.outputs) == 1 and max(crowd.outputs) == 128
    assert crowd.arrivals(2.0)[-1] == pytest.approx(crowd.arrivals(1.0)[-1] / 2)


def test_request_level_returns_a_batch_whole_and_iteration_level_does_not():
    items = [("a", 64, 2, 0.0), ("b", 64, 40, 0.0)]
    ft, orca = serve(GPT3, "ft", 8, items), serve(GPT3, "orca", 8, items)
    assert ft["a"] == ft["b"]  # the early-finished one waits for the batch
    assert orca["a"] < orca["b"]


def test_shortest_first_makes_a_long_prompt_wait_token_by_token():
    items = [("a", 32, 1, 0.0), ("b", 512, 1, 0.0)]
    plain, shortest = serve(GPT3, "ft", 8, items), serve(GPT3, "ft", 8, items, costs=Costs(shortest_first=True))
    assert shortest["b"] > 5 * plain["b"]  # 480 more iterations, one input token each


def test_iteration_level_sustains_a_rate_request_level_cannot():
    crowd = draw_crowd(60, seed=0)
    orca, ft = run_point(GPT3, "orca", 32, crowd, 4.0), run_point(GPT3, "ft", 8, crowd, 4.0)
    assert orca.meets(190) and not ft.meets(190)
    assert orca.median_ms < ft.median_ms


def test_a_headline_only_at_the_papers_point():
    found = {"orca": Capacity("orca", 32, 7.0), "ft": Capacity("ft", 1, 0.2)}
    (h,) = headlines(Options(), found)
    assert (h.published, h.reproduced, h.verdict) == (36.9, 35.0, "reproduced")
    assert not headlines(Options(bound_ms=80), found) and not headlines(Options(model="gpt3-13b"), found)
    assert not headlines(Options(), found | {"orca": Capacity("orca", 32, 64.0, bounded=False)})


def test_a_missed_headline_is_taken_apart():
    text = account_text({"headline": "Orca over FT", "mechanism": {"orca": 8.0, "ft": 2.0}, "mechanism_ratio": 4.0,
                         "steps": [{"cost": "+ pipelining", "orca": 16.0, "ft": 0.5, "ratio": 32.0}],
                         "published": 36.9})  # fmt: skip
    assert "the mechanism alone" in text and "32.00x, within 35%" in text


def test_the_command_speaks_json_and_text(capsys):
    args = ["papers", "orca", "--requests", "24", "--rate", "0.5", "2"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["capacities"]) == {"orca", "ft"} and report["micro_ms"] > 0
    assert all(len(c["points"]) == 2 for c in report["capacities"].values())
    assert main([*args, "--system", "orca", "--model", "gpt3-13b", "--bound-ms", "100"]) == 0
    out = capsys.readouterr().out
    for expected in ("Orca", "gpt3-13b", "at most 100 ms", "rates tried", "U(32, 512)"):
        assert expected in out, expected


def test_bad_options_say_what_is_allowed(capsys):
    assert main(["papers", "orca", "--requests", "4"]) == 2
    assert "at least 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["papers", "orca", "--bound-ms", "0"])
    assert "above 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["papers", "orca", "--model", "gpt4"])
    assert "invalid choice" in capsys.readouterr().err


def test_the_papers_bench_entry_names_orca():
    from minillm.bench import papers

    assert papers.PAPERS["orca"] is papers.bench_orca
