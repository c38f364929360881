"""SGLang's RadixAttention, reproduced (minillm/papers/sglang*.py): the workloads, the closed-loop client, the cache's
hit rates and throughput, the longest-prefix-first queue, the headlines, the command."""

from __future__ import annotations

import json

import pytest

from minillm.cli import main
from minillm.errors import ConfigError
from minillm.papers import sglang_setup as setup
from minillm.papers.sglang import Options, Seen, run_workload
from minillm.papers.sglang_report import headlines
from minillm.papers.sglang_workloads import programs_of

SMALL = Options(requests=200)  # MMLU: 15-39 questions of each of the 10 subjects (fewer: all start together)


def test_mmlu_questions_share_their_subjects_examples_and_nothing_else():
    programs = programs_of("mmlu", 40, seed=1)
    first, second, other = programs[0][0].tokens, programs[1][0].tokens, programs[-1][0].tokens
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert shared > 200 and first[:shared] == second[:shared]  # abstract algebra's five examples
    assert first[0] != other[0]  # another subject's examples
    assert all(len(p) == 1 and p[0].reply == 1 for p in programs)  # one token out
    assert len(programs_of("mmlu")) == sum(s[1] for s in setup.MMLU_SUBJECTS) == 1369


def test_chats_have_four_turns_of_the_benchmarks_lengths():
    for workload, (low, high) in setup.CHAT_ANSWER.items():
        programs = programs_of(workload, 5)
        assert len(programs) == 5 and all(len(p) == setup.CHAT_TURNS for p in programs)
        assert all(256 <= len(t.tokens) <= 512 and low <= t.reply <= high for p in programs for t in p)


def test_seen_matches_a_prompt_up_to_its_last_token():
    seen = Seen()
    seen.add([1, 2, 3, 4])
    assert seen.match([1, 2, 3, 4]) == 3  # the last one must run for the next token
    assert seen.match([1, 2, 9, 9]) == 2 and seen.match([7, 1, 2]) == 0


def test_the_cache_hits_and_buys_mmlu_throughput():
    served = run_workload(SMALL, "mmlu")
    cache, off = served["cache"], served["no-cache"]
    assert off.hit_rate == 0 and off.computed_tokens == off.prompt_tokens
    assert 0.5 < cache.hit_rate <= cache.optimal_rate < 0.99
    assert cache.computed_tokens < off.computed_tokens / 2
    assert cache.throughput > 2 * off.throughput  # a prefill-bound workload
    token = run_workload(SMALL, "mmlu", ("cache",), block_size=1)["cache"]
    assert cache.hit_rate < token.hit_rate <= token.optimal_rate  # whole blocks lose each prompt's partial one


def test_longest_prefix_first_keeps_the_chats_cached():
    served = run_workload(Options(requests=24), "chat-short")
    lpm, fcfs = served["cache"], served["fcfs"]
    assert lpm.hit_rate > fcfs.hit_rate + 0.1  # first come, first served thrashes the pool
    assert lpm.throughput > served["no-cache"].throughput


def test_headlines_keep_the_range_and_compare_the_share_of_optimal():
    served = {"mmlu": run_workload(SMALL, "mmlu", ("cache",))}
    rate, share = headlines(SMALL, served)
    assert rate.at_least and rate.published == 50.0 and rate.verdict == "kept"
    assert share.published == 96.0 and share.reproduced == pytest.approx(
        100 * served["mmlu"]["cache"].hit_rate / served["mmlu"]["cache"].optimal_rate
    )
    assert share.verdict == "reproduced"


def test_the_command_prints_the_report_and_speaks_json(capsys):
    assert main(["papers", "sglang", "--workload", "mmlu", "--requests", "150", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["served"]) == {"mmlu"} and set(report["served"]["mmlu"]) == set(setup.SYSTEMS)
    assert [h["verdict"] for h in report["headlines"]] == ["kept", "reproduced"]
    assert report["granularity"]["mmlu"]["token_hit_rate"] > report["served"]["mmlu"]["cache"]["hit_rate"]
    assert main(["papers", "sglang", "--workload", "chat-short", "--requests", "6", "--block-size", "1"]) == 0
    out = capsys.readouterr().out
    for expected in ("SGLang", "a10g", "hit rate", "over no cache", "first come first served", "Fig. 8(c)"):
        assert expected in out, expected
    assert "one token a block" not in out  # already at block size 1
    assert "a KV pool that holds every conversation" in out


def test_bad_options_say_what_is_allowed(capsys):
    assert main(["papers", "sglang", "--requests", "1"]) == 2
    assert "at least 2" in capsys.readouterr().err
    assert main(["papers", "sglang", "--gpu", "a10x", "--requests", "8"]) == 2
    assert "unknown GPU 'a10x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["papers", "sglang", "--workload", "hellaswag"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["papers", "sglang", "--block-size", "0"])
    assert "at least 1" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown workload"):
        Options(workloads=("gsm8k",)).check()


def test_the_papers_bench_entry_names_sglang():
    from minillm.bench import papers

    assert papers.PAPERS["sglang"] is papers.bench_sglang
