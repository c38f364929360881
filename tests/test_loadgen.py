"""The load generator: the same users as `run`, figures computed as documented, output tokens counted the same way
whatever the server says in its usage (stand-in servers that stream two tokens a chunk and count the end token, as
servers may), and the `load` command against minillm's own server on loopback."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from minillm.__main__ import main
from minillm.errors import ConfigError
from minillm.model.tokenizer import encode_prompt
from minillm.runs.workload import ChatKnobs, make_workload
from minillm.serving.export import export_llama
from minillm.serving.loadgen import Job, Outcome, jobs_from_workload, request_body, run_jobs, summarize_load
from minillm.serving.server import ServerThread, build_loop
from tests.conftest import random_model


@pytest.mark.parametrize("name", ["chat", "system-prompt", "long-prompts"])
def test_jobs_are_the_workloads_users(name):
    jobs = jobs_from_workload(name, 40, rate_per_s=4.0, seed=3)
    users = make_workload(name, ChatKnobs(requests=40, rate_per_s=4.0), seed=3)
    assert [encode_prompt(j.prompt, j.preamble) for j in jobs] == [r.prompt_ids for r in users]
    assert [j.send_at_s for j in jobs] == [r.arrival_s for r in users]
    assert [j.max_tokens for j in jobs] == [r.max_new_tokens for r in users]
    assert all(j.send_at_s == 0 for j in jobs_from_workload(name, 5))  # no rate: everyone at once


def test_forced_lengths_ignore_eos_and_hang_ups_are_a_share():
    forced = jobs_from_workload("chat", 30, force_lengths=True)
    assert all(j.ignore_eos for j in forced) and request_body(forced[0], "m", "chat")["ignore_eos"] is True
    hanging = [j.hang_up_after is not None for j in jobs_from_workload("chat", 200, hang_up=0.25)]
    assert 25 <= sum(hanging) <= 75
    assert not any(j.hang_up_after is not None for j in jobs_from_workload("chat", 50))


def test_bad_settings_say_what_to_do():
    with pytest.raises(ConfigError, match="load sends the workloads"):
        jobs_from_workload("seed-story", 4)
    with pytest.raises(ConfigError, match="in \\[0, 1\\]"):
        jobs_from_workload("chat", 4, hang_up=2)
    with pytest.raises(ConfigError, match="use --api chat"):
        request_body(Job("spell 4", 3, preamble="be brief"), "m", "completions")


def test_request_bodies():
    chat = request_body(Job("spell 4", 3, preamble="be brief"), "m", "chat")
    assert chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "spell 4"}]
    plain = request_body(Job("spell 4", 3), "m", "completions")
    assert plain["prompt"] == "spell 4" and plain["stream"] and plain["stream_options"] == {"include_usage": True}


def test_summary_figures_by_hand():
    def done(sent, chunks, end, tokens):
        return Outcome(Job("p", 9), sent_s=sent, chunk_s=chunks, end_s=end, output_tokens=tokens)

    outcomes = [
        done(0.0, [0.5, 0.6, 0.7], 0.8, 4),  # TTFT 0.5, TPOT (0.8 - 0.5) / 3 = 0.1, gaps 0.1 and 0.1
        done(1.0, [1.2, 2.2], 2.3, 2),  # TTFT 0.2, TPOT 1.1, gap 1.0
        done(0.1, [0.3], 0.3, 1),  # TTFT 0.2, one token: no TPOT
        Outcome(Job("p", 9), sent_s=0.2, error="HTTP 500"),
        Outcome(Job("p", 9), sent_s=0.2, chunk_s=[0.4], hung_up=True),
    ]
    s = summarize_load(outcomes, ttft_target_s=0.3, tpot_target_s=0.5)
    assert (s["requests"], s["finished"], s["errors"], s["aborted"], s["output_tokens"]) == (5, 3, 1, 1, 7)
    assert s["wall_s"] == pytest.approx(2.3) and s["tokens_per_s"] == pytest.approx(7 / 2.3)
    assert s["ttft_p50_s"] == pytest.approx(0.2) and s["tpot_p50_s"] == pytest.approx(0.6)
    assert s["itl_p50_s"] == pytest.approx(0.1) and s["latency_p50_s"] == pytest.approx(0.8)
    assert s["goodput_requests"] == 1 and s["goodput_share"] == pytest.approx(1 / 3)  # only the one-token reply
    assert s["first_error"] == "HTTP 500"


def stand_in_server(with_usage: bool) -> FastAPI:
    """Another server's way to stream: two tokens per chunk; usage only if asked for (or never), counting the end
    token too (as transformers' server does)."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        asks_usage = (body.get("stream_options") or {}).get("include_usage") and with_usage

        async def events():
            for piece in ["ab", "cd", "é"]:  # 6 bytes: minillm's tokenizer makes 6 tokens of them
                yield f"data: {json.dumps({'id': 'x', 'choices': [{'index': 0, 'text': piece}]})}\n\n"
            if asks_usage:
                yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': {'completion_tokens': 7}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.mark.parametrize("with_usage", [True, False], ids=["usage", "no-usage"])
def test_output_tokens_are_the_texts_whatever_the_server_counts(with_usage, tmp_path):
    export_llama(random_model("gqa"), tmp_path)  # (its tokenizer.json: minillm's, for another server)
    tokenizers = ["minillm", "usage", str(tmp_path)]  # (the tokenizers package is in requirements.txt)
    with ServerThread(None, app=stand_in_server(with_usage)) as other:
        counts = {t: asyncio.run(run_jobs(other.url, [Job("hi", 5)] * 2, model="m", api="completions", tokenizer=t))
                  for t in tokenizers}  # fmt: skip
    assert [(o.text, len(o.chunk_s)) for o in counts["minillm"]] == [("abcdé", 3)] * 2
    assert [o.output_tokens for o in counts["minillm"]] == [6, 6]  # the text's tokens: the same on any server
    assert [o.output_tokens for o in counts["usage"]] == [7 if with_usage else 3] * 2  # its usage, or chunks
    assert [o.output_tokens for o in counts[str(tmp_path)]] == [6, 6]  # exported tokenizer.json: bytes again


def test_a_bad_tokenizer_says_what_to_give(tmp_path):
    with pytest.raises(ConfigError, match="give a tokenizer.json"):
        asyncio.run(run_jobs("http://127.0.0.1:9/v1", [Job("hi", 5)], model="m", tokenizer=str(tmp_path)))


@pytest.fixture(scope="module")
def server(shipped_model):
    with ServerThread(build_loop(shipped_model, slots=4)) as running:
        yield running


def test_load_json_uses_run_json_names(server, capsys, tmp_path):
    out = tmp_path / "load.json"
    code = main(["load", "--url", server.url, "--requests", "6", "--json", "--out", str(out), "--ttft-target-s", "30"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["finished"] == 6 and summary["errors"] == 0
    run_names = {"requests", "finished", "output_tokens", "wall_s", "tokens_per_s", "ttft_p50_s", "ttft_p99_s",
                 "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s", "latency_p50_s", "latency_p99_s"}  # fmt: skip
    assert run_names <= set(summary) and {"goodput_per_s", "goodput_share"} <= set(summary)
    saved = json.loads(out.read_text())
    assert len(saved["requests"]) == 6 and saved["summary"]["output_tokens"] == summary["output_tokens"]


def test_load_text_summary(server, capsys):
    assert main(["load", "--url", server.url, "--requests", "3", "--api", "completions", "--rate-per-s", "20"]) == 0
    text = capsys.readouterr().out
    for needle in ("3 finished, 0 errors", "output tokens/s", "TTFT", "TPOT", "ITL", "goodput"):
        assert needle in text


def test_load_without_a_server_is_one_line(capsys):
    with ServerThread(None, app=FastAPI()) as nothing:  # a port that answers, with no API behind it
        url = nothing.url
    code = main(["load", "--url", url, "--requests", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: could not ask") and err.count("\n") == 1
