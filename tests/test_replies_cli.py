"""n replies to each request from the command line: `run --n` (the prompt's KV computed once for its n replies,
layers/replies.py) and `load --n` (every choice of a streamed reply read by its index and counted), and a bad --n
told in one line."""

from __future__ import annotations

import json
import re

import pytest

from minillm.__main__ import main
from minillm.layers.replies import MAX_REPLIES
from minillm.serving.loadgen import Job, Outcome, request_body, summarize_load

CHAT = ["run", "--workload", "chat", "--requests", "4", "--rate", "1000"]


def test_run_n_makes_n_replies_and_computes_each_prompt_about_once(capsys):
    assert main([*CHAT, "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["n"] == 1 and one["finished"] == 4
    assert main([*CHAT, "--n", "2"]) == 0  # (the summary's words: its replies line)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("replies"))
    found = re.search(r"(\d+) to each of (\d+) prompts: (\d+) made; (\d+) prompt tokens computed for the (\d+)", line)
    n, prompts, made, computed, asked = map(int, found.groups())
    assert (n, prompts, made, asked) == (2, 4, 8, 2 * one["prompt_tokens"]), line
    # each second reply runs only its prompt's last token (its own pick needs its own logits)
    assert computed < 2 * one["prefill_tokens"] and computed == one["prefill_tokens"] + 4, line


@pytest.mark.parametrize("command", ["run", "load"])
@pytest.mark.parametrize("value", ["0", str(MAX_REPLIES + 1), "two", "2.5"])
def test_a_bad_n_is_one_line_naming_the_flag_and_the_range(command, value, capsys):
    argv = [command, "--n", value] + (["--url", "http://127.0.0.1:9/v1"] if command == "load" else [])
    assert main(argv) == 2  # (checked before a model loads or a server is asked)
    err = capsys.readouterr().err
    assert err.startswith("error: --n ") and f"from 1 to {MAX_REPLIES}" in err and err.count("\n") == 1, err


def test_the_load_generator_times_each_choice_apart():
    assert request_body(Job("spell 4", 3, n=3), "m", "chat")["n"] == 3
    assert "n" not in request_body(Job("spell 4", 3), "m", "chat")  # (one reply: the field left out)
    # two choices streamed interleaved: 0 at 0.5, 0.7, 0.9; 1 at 0.6, 1.0; each choice 3 tokens on average
    out = Outcome(Job("p", 9, n=2), sent_s=0.0, chunk_s=[0.5, 0.6, 0.7, 0.9, 1.0], chunk_index=[0, 1, 0, 0, 1],
                  end_s=1.0, output_tokens=6, texts=["abc", "abc"])  # fmt: skip
    s = summarize_load([out])
    assert sorted(out.gaps()) == pytest.approx([0.2, 0.2, 0.4]) and s["itl_p50_s"] == pytest.approx(0.2)
    assert s["ttft_p50_s"] == pytest.approx(0.5) and s["tpot_p50_s"] == pytest.approx((1.0 - 0.5) / 2)
    assert (s["replies"], s["output_tokens"]) == (2, 6)


def test_load_n_reads_and_counts_every_choice(server, capsys, tmp_path):
    out = tmp_path / "load.json"
    argv = ["load", "--url", server.url, "--requests", "2", "--seed", "8", "--json"]  # (two short spellings)
    assert main([*argv, "--n", "2", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["finished"], summary["replies"], summary["errors"]) == (2, 4, 0)
    for request in json.loads(out.read_text())["requests"]:
        texts = request["texts"]
        assert len(texts) == 2 and texts[0] and texts[0] == texts[1]  # (greedy: the same reply twice)
        assert sorted(set(request["chunk_index"])) == [0, 1] and request["text"] == texts[0]
        assert request["output_tokens"] == 2 * len(texts[0].encode())  # both choices' tokens
    assert main(argv) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["replies"] == 2 and 2 * alone["output_tokens"] == summary["output_tokens"]


def test_the_replies_bench_entry_runs_small_and_reports(shipped_model, monkeypatch, tmp_path):
    from minillm.bench import replies
    from minillm.bench.report import markdown, plot_all
    from minillm.bench.suite import BENCHES

    assert BENCHES["replies"] is replies.bench_replies
    for name, small in (("N", 2), ("SWEEP", (1, 2)), ("REPLY", 4)):  # (the entry at a tiny size: about a second)
        monkeypatch.setattr(replies, name, small)
    r = replies.bench_replies(shipped_model, None)
    assert r["twins_exact"] == r["twins_checked"] == 4 and [x["n"] for x in r["sweep"]] == [1, 2]
    assert r["shared"]["prompt_tokens_computed"] == r["prompt_len"] + 1
    assert r["separate"]["prompt_tokens_computed"] == 2 * r["prompt_len"] and r["blocks_ratio"] < 1
    results = {"machine": "m", "device": "cpu", "date": "d", "replies": r}
    assert [p.name for p in plot_all(results, tmp_path)] == ["replies.png"]
    text = markdown(results, "python -m minillm bench --only replies", "plots")
    assert "## 21. n replies to one prompt" in text and "![replies](plots/replies.png)" in text
