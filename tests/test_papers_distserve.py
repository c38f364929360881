"""DistServe, reproduced (minillm/papers/distserve*.py): the crowds, the step prices, the systems, the goodput search's
verdicts, the command."""

from __future__ import annotations

import json

import pytest

from minillm.cli import main
from minillm.papers import distserve_setup as setup
from minillm.papers.distserve import Goodput, Options, Point, judge, meets
from minillm.papers.distserve_account import account_text
from minillm.papers.distserve_cost import step_ms
from minillm.papers.distserve_report import headlines
from minillm.papers.distserve_systems import Deployment, Outcome, serve
from minillm.papers.distserve_trace import draw

CHATBOT = setup.APPS["chatbot-13b"]


def deployment(prices="roofline", **placement) -> Deployment:
    return Deployment("opt-13b", 1, setup.Placement(**({"prefill_tp": 2, "decode_tp": 1} | placement)), prices)


def test_the_crowds_keep_the_papers_lengths_and_one_draw_serves_every_rate():
    fixed = draw("fixed-512-64", 30, seed=1)
    assert set(fixed.prompts) == {512} and set(fixed.outputs) == {64}
    chat = draw("sharegpt", 400, seed=0)
    assert max(p + o for p, o in zip(chat.prompts, chat.outputs)) < 2048  # 0-prepare-dataset.py's filter
    assert 450 < sum(chat.prompts) / 400 < 800 and 300 < sum(chat.outputs) / 400 < 550
    assert chat.arrivals(3.0)[-1] == pytest.approx(chat.arrivals(1.0)[-1] / 3)


def test_the_papers_step_prices_are_its_fitted_profiles():
    # OPT-13B, TP1, DistServe's engine: a + b t + c sum(l^2), then the Ray hop (2 ms + 1e-4 ms a token)
    assert step_ms("distserve", 1, [512], []) == pytest.approx(18.1025 + 0.101912 * 512 + 7.122e-6 * 512**2 + 2.0512,
                                                                rel=1e-4)  # fmt: skip
    small = step_ms("vllm", 1, [], [100] * 94)
    large = step_ms("vllm", 1, [], [100] * 95)  # 95 and up: the large-batch fit
    assert small == pytest.approx(23.475 + 0.000592934 * 101 * 94 + 0.0607269 * 94 + 2 + 0.94, rel=1e-4)
    assert large == pytest.approx(20.2064 + 0.000490773 * 101 * 95 + 0.120003 * 95 + 2 + 0.95, rel=1e-4)
    assert step_ms("vllm", 1, [512], []) > step_ms("distserve", 1, [512], []) > step_ms("distserve", 2, [512], [])


def test_disaggregation_hands_every_request_over_and_ends_the_stall_between_tokens():
    crowd = draw("sharegpt", 24, seed=2)
    split = serve(deployment(), "distserve", crowd, 2.0)
    together = serve(deployment(), "vllm", crowd, 2.0)
    assert len(split) == 24 and all(o.ttft_s > 0 and o.tpot_s > 0 for o in split)
    worst = lambda outs: max(o.tpot_s for o in outs)  # noqa: E731
    assert worst(split) < worst(together)  # no whole prompt runs between two of a decoding request's tokens
    assert max(o.ttft_s for o in split) < max(o.ttft_s for o in together)  # prefill on 2 cards, not 1


def test_each_phase_alone_measures_only_its_own_latency():
    crowd = draw("fixed-512-64", 12, seed=0)
    prefill = serve(deployment(prefill_tp=1), "prefill", crowd, 4.0)
    decode = serve(deployment(), "decode", crowd, 4.0)
    assert all(o.tpot_s is None and o.ttft_s > 0.05 for o in prefill)  # one token: a 512-token prefill
    assert all(o.ttft_s is None and 0.005 < o.tpot_s < 0.05 for o in decode)


def test_goodput_counts_both_slos_or_the_p90_of_each():
    outcomes = [Outcome(0.1, 0.05)] * 8 + [Outcome(0.3, 0.05), Outcome(0.1, None)]
    share, p90_ttft, p90_tpot = judge(outcomes, 0.25, 0.1)
    assert share == 0.9 and p90_ttft == pytest.approx(0.12) and p90_tpot == 0.05
    point = Point(1.0, 1.0, 0.89, 0.1, 0.03)
    assert not meets(point, Options()) and meets(point, Options(app="figure-1"))  # Figure 1 reads the P90s
    assert not meets(Point(1.0, 1.0, 1.0, 0.5, 0.01), Options(app="figure-1"))


def test_headlines_only_at_the_papers_own_point():
    found = {"vllm": Goodput("vllm", 1, 0.5), "distserve": Goodput("distserve", 3, 3.3)}
    (h,) = headlines(Options(), found)
    assert h.at_least and h.published == 2.0 and h.reproduced == pytest.approx(2.2) and h.verdict == "kept"
    assert not headlines(Options(slo_scale=0.5), found) and not headlines(Options(prefill_tp=1), found)
    assert not headlines(Options(), found | {"distserve": Goodput("distserve", 3, 9.0, bounded=False)})
    fig1 = headlines(Options(app="figure-1"), found | {"prefill": Goodput("prefill", 1, 5.6)})
    assert [(h.about, h.unit, round(h.reproduced)) for h in fig1] == [("vllm", "req/min", 30),
                                                                      ("prefill", "req/min", 336),
                                                                      ("distserve/vllm", "x", 2)]  # fmt: skip


def test_a_missed_headline_is_taken_apart():
    text = account_text({"missed": ["DistServe over vLLM"], "ttft_s": 0.25,
                         "roofline": {"per_gpu": {"vllm": 3.0, "distserve": 1.5}, "ratio": 0.5},
                         "paper_prices": {"per_gpu": {"vllm": 0.5, "distserve": 1.5}, "ratio": 3.0},
                         "never_in_time": {"roofline": {"vllm": 0.0}, "paper": {"vllm": 0.09}},
                         "placement": {"name": "1P(TP2) + 2D(TP1)", "per_gpu": 3.0, "ratio": 1.0}})  # fmt: skip
    assert "0.50x (below the paper's range)" in text and "3.00x (in the paper's range)" in text
    assert "vllm 9%" in text and "1P(TP2) + 2D(TP1)" in text


def test_the_command_searches_and_speaks_json(capsys):
    assert main(["papers", "distserve", "--app", "figure-1", "--system", "prefill", "--requests", "10",
                 "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    (h,) = report["headlines"]
    assert h["about"] == "prefill" and h["published"] == 336 and h["verdict"] in ("reproduced", "not reproduced")
    assert report["goodputs"]["prefill"]["points"] and report["account"]["paper_prices"]["per_gpu"]["prefill"] > 0
    assert main(["papers", "distserve", "--system", "prefill", "--requests", "10", "--slo-scale", "2"]) == 0
    out = capsys.readouterr().out
    for expected in ("DistServe", "TTFT <= 0.5 s", "rates tried", "stated, not run here", "12.6x tighter SLO"):
        assert expected in out, expected


def test_bad_options_say_what_is_allowed(capsys):
    assert main(["papers", "distserve", "--requests", "5"]) == 2
    assert "at least 10" in capsys.readouterr().err
    assert main(["papers", "distserve", "--prices", "paper", "--model", "mistral-7b", "--requests", "10"]) == 2
    assert "needs --model opt-13b" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["papers", "distserve", "--slo-scale", "0"])
    assert "above 0" in capsys.readouterr().err


def test_the_papers_bench_entry_names_distserve():
    from minillm.bench import papers

    assert papers.PAPERS["distserve"] is papers.bench_distserve
