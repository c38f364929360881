"""The HTTP server on loopback: OpenAI-shaped replies equal to the plain loop's, errors that name the problem,
backpressure, hang-ups that free their seat and KV blocks at once, a bounded live trace, and a soak.

Each server runs on a thread of this process (minillm.serving.server.ServerThread) on a free port of 127.0.0.1; its
engine in a process of its own (EngineProcess, as `serve` runs it) where the test says process=True, else on a
thread (ServeLoop). tests/test_openai_api.py holds the API's options (sampling, stop, logprobs, errors, limits).
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from minillm.config import EngineConfig
from minillm.engine.generate import generate
from minillm.engine.request import Request
from minillm.engine.scheduler import ContinuousScheduler
from minillm.layers import LayeredEngine
from minillm.model.tokenizer import BOS, decode, encode, encode_prompt
from minillm.runs import trace_file
from minillm.runs.metrics import summarize
from minillm.serving import serve_loop
from minillm.serving.loadgen import Job, run_jobs
from minillm.serving.server import ServerThread, build_loop
from minillm.serving.token_stream import TokenStream
from minillm.training import tasks

LONG = {"ignore_eos": True, "max_tokens": 900}  # a reply that runs for seconds: long enough to hang up on


def expected(model, prompt: str, max_tokens: int, preamble: str | None = None, chat: bool = True) -> list[int]:
    """The plain loop's reply: to the chat format, or (completions) to the raw text after <bos>."""
    ids = encode_prompt(prompt, preamble) if chat else [BOS, *encode(prompt)]
    return generate(model, ids, max_tokens, use_cache=False).tokens


def sse_messages(response: httpx.Response) -> list:
    """The data of every server-sent event, parsed ([DONE] stays a string)."""
    lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in lines]


def gauges(client: httpx.Client, base: str) -> dict[str, float]:
    text = client.get(f"{base}/metrics").text
    return {k: float(v) for k, v in (line.split() for line in text.splitlines() if line and line[0] != "#")}


def wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there in time"
        time.sleep(0.02)


# --- replies -------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_replies_equal_the_plain_loop(server, client, shipped_model, stream, endpoint):
    """Completions send the prompt as raw text (after <bos>), chat in the chat format the model was trained on."""
    chat = endpoint.startswith("chat")
    ask = {"messages": [{"role": "user", "content": "count down from 9"}]} if chat else {"prompt": "count down from 9"}
    body = ask | {"max_tokens": 30, "stream": stream, "return_token_ids": True}
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = client.post(f"{server.url}/{endpoint}", json=body)
    assert response.status_code == 200
    want = expected(shipped_model, "count down from 9", 30, chat=chat)
    if stream:
        messages = sse_messages(response)
        choices = [c for m in messages[:-1] for c in m["choices"]]
        pieces = [c["delta"].get("content", "") if chat else c["text"] for c in choices]
        text, ids = "".join(pieces), [t for c in choices for t in c.get("token_ids", [])]
        usage, finish = messages[-2]["usage"], choices[-1]["finish_reason"]
    else:
        choice, usage = response.json()["choices"][0], response.json()["usage"]
        text, ids, finish = (
            choice["message"]["content"] if chat else choice["text"],
            choice["token_ids"],
            choice["finish_reason"],
        )
    assert ids == want and text == decode(want)
    prompt_ids = encode_prompt("count down from 9") if chat else [BOS, *encode("count down from 9")]
    assert usage["completion_tokens"] == len(want) and usage["prompt_tokens"] == len(prompt_ids)
    assert finish == ("stop" if len(want) < 30 else "length")


def test_chat_maps_the_system_message_to_the_preamble(server, client, shipped_model):
    system = tasks.PREAMBLES["assistant"]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "spell 305"}]
    body = {"messages": messages, "max_tokens": 40, "return_token_ids": True}
    choice = client.post(f"{server.url}/chat/completions", json=body).json()["choices"][0]
    assert choice["token_ids"] == expected(shipped_model, "spell 305", 40, system)
    assert choice["message"] == {"role": "assistant", "content": decode(choice["token_ids"])}


def test_a_stream_is_shaped_as_openai_sends_it(server, client):
    body = {"messages": [{"role": "user", "content": "count down from 4"}], "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with client.stream("POST", f"{server.url}/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        messages = sse_messages(response)
    assert messages[-1] == "[DONE]"
    *chunks, usage_only = messages[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(m["object"] == "chat.completion.chunk" and m["id"] == chunks[0]["id"] for m in messages[:-1])
    finishes = [m["choices"][0]["finish_reason"] for m in chunks]
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    assert usage_only["choices"] == [] and usage_only["usage"]["completion_tokens"] == len("4 3 2 1")
    assert not any("usage" in m for m in chunks)  # usage exactly once: on the last chunk, which has no choices
    assert "".join(m["choices"][0]["delta"].get("content", "") for m in chunks) == "4 3 2 1"


def test_a_stream_sends_usage_only_when_asked(server, client):
    body = {"messages": [{"role": "user", "content": "spell 42"}], "stream": True}
    with client.stream("POST", f"{server.url}/chat/completions", json=body) as response:
        messages = sse_messages(response)
    assert messages[-1] == "[DONE]" and not any("usage" in m for m in messages[:-1])
    assert client.post(f"{server.url}/chat/completions", json=body | {"stream": False}).json()["usage"]["total_tokens"]


def test_a_stream_interval_sends_fewer_larger_pieces_and_the_first_token_at_once(shipped_model):
    loop = build_loop(shipped_model, slots=2, stream_interval=4).start()
    stream = TokenStream()
    try:
        loop.submit(Request("r", encode_prompt("count down from 9"), 30), stream)
        events = [stream.get(timeout=10)]
        while events[-1].kind != "done":
            events.append(stream.get(timeout=10))
    finally:
        loop.stop()
    pieces = [e.tokens for e in events if e.kind == "tokens"]
    want = expected(shipped_model, "count down from 9", 30)
    assert [t for p in pieces for t in p] == want
    assert [len(p) for p in pieces[:-1]] == [1] + [4] * (len(pieces) - 2) and 1 <= len(pieces[-1]) <= 4


def test_models_health_and_metrics(server, client):
    assert client.get(f"{server.url}/models").json()["data"][0]["id"] == "minillm"
    assert client.get(f"{server.url}/models/minillm").json() == client.get(f"{server.url}/models").json()["data"][0]
    assert client.get(f"{server.base}/health").json()["status"] == "ok"
    client.post(f"{server.url}/completions", json={"prompt": "spell 7"})
    text = client.get(f"{server.base}/metrics").text
    names = ["requests_running", "requests_waiting", "kv_blocks_used", "kv_blocks_total", "preemptions_total",
             "generation_tokens_total", "time_to_first_token_seconds_count",
             "inter_token_latency_seconds_bucket"]  # fmt: skip
    for name in names:
        assert f"minillm_{name}" in text
    values = gauges(client, server.base)
    assert values["minillm_time_to_first_token_seconds_count"] >= 1 and values["minillm_kv_blocks_total"] > 0


def test_serve_on_a_taken_port_is_one_line(capsys):
    from minillm.__main__ import main
    from minillm.serving.server import bind

    with bind("127.0.0.1", 0) as taken:
        taken.listen()
        code = main(["serve", "--port", str(taken.getsockname()[1])])
    err = capsys.readouterr().err
    assert code == 2 and "is another server running there? choose another --port" in err and err.count("\n") == 1


# --- bad input -----------------------------------------------------------------------------------
BAD = {
    "malformed JSON": (b'{"prompt": "spell 4"', "not valid JSON"),
    "not an object": (b'["spell 4"]', "must be a JSON object"),
    "empty prompt": (b'{"prompt": "  "}', "prompt is empty"),
    "max_tokens 0": (b'{"prompt": "spell 4", "max_tokens": 0}', "max_tokens must be a whole number of at least 1"),
    "past the context": (b'{"prompt": "spell 4", "max_tokens": 5000}', "use max_tokens <= 1016"),
    "no prompt": (b'{"max_tokens": 3}', "prompt must be a string"),
    "stream not a bool": (b'{"prompt": "spell 4", "stream": "yes"}', "stream must be true or false"),
}


@pytest.mark.parametrize("raw,needle", BAD.values(), ids=BAD.keys())
def test_bad_input_gets_400_with_an_openai_error(server, client, raw, needle):
    response = client.post(f"{server.url}/completions", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert needle in error["message"] and error["type"] == "invalid_request_error"


def test_bad_chat_messages(server, client):
    for messages, needle in [([], "non-empty list"), ([{"role": "system", "content": "hi"}], "no user message"),
                             ([{"role": "user", "content": 3}], "string or a list of text parts")]:  # fmt: skip
        response = client.post(f"{server.url}/chat/completions", json={"messages": messages})
        assert response.status_code == 400 and needle in response.json()["error"]["message"]


def test_a_prompt_that_never_fits_the_pool_is_refused_and_others_are_served(shipped_model, client):
    with ServerThread(build_loop(shipped_model, slots=2, num_blocks=4, block_size=4)) as small:
        refused = client.post(f"{small.url}/completions", json={"prompt": "count down from 12", "max_tokens": 4})
        served = client.post(f"{small.url}/completions", json={"prompt": "spell 1", "max_tokens": 2})
        trace = trace_file.loads(client.get(f"{small.base}/trace").content)
    assert refused.status_code == 400 and "KV blocks but the whole pool has 4" in refused.json()["error"]["message"]
    assert served.status_code == 200 and served.json()["choices"][0]["text"]
    assert [r.finish_reason.split(":")[0] for r in trace.requests] == ["rejected", "length"]


# --- backpressure and hang-ups -----------------------------------------------------------------------
def test_a_full_queue_gets_429_with_retry_after_and_nothing_is_queued(shipped_model, client):
    with ServerThread(build_loop(shipped_model, slots=1, max_waiting=1)) as one_seat:
        body = {"prompt": "count down from 5", "stream": True} | LONG
        with client.stream("POST", f"{one_seat.url}/completions", json=body) as running:
            lines = running.iter_lines()  # (keep it: a line iterator dropped half-read closes the connection)
            next(lines)  # it has a seat and is producing tokens
            with client.stream("POST", f"{one_seat.url}/completions", json=body) as queued:
                assert queued.status_code == 200  # accepted: first in the queue
                full = client.post(f"{one_seat.url}/completions", json={"prompt": "spell 4"})
                assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1
                assert full.json()["error"]["type"] == "rate_limit_error"
                now = gauges(client, one_seat.base)
                assert now["minillm_requests_waiting"] == 1 and now["minillm_requests_running"] == 1
                assert now['minillm_requests_total{outcome="refused"}'] == 1


def test_hanging_up_frees_the_seat_and_the_kv_blocks_by_the_next_step(shipped_model, client):
    """A is running, B waits behind it: B hangs up while queued, A mid-stream; then C is served alone."""
    with ServerThread(build_loop(shipped_model, slots=1, process=True)) as one_seat:
        body = {"prompt": "count down from 5", "stream": True} | LONG
        with client.stream("POST", f"{one_seat.url}/completions", json=body) as a:
            lines = a.iter_lines()
            first = json.loads(next(lines)[6:])
            with client.stream("POST", f"{one_seat.url}/completions", json=body) as b:
                assert b.status_code == 200
            for _ in range(4):
                next(lines)  # A streams on; then the client closes the connection
        wait_for(lambda: gauges(client, one_seat.base)["minillm_requests_running"] == 0)
        now = gauges(client, one_seat.base)
        assert now["minillm_kv_blocks_used"] == 0 and now["minillm_requests_waiting"] == 0
        c = client.post(f"{one_seat.url}/completions", json={"prompt": "spell 12", "max_tokens": 20})
        assert c.status_code == 200
        trace = trace_file.loads(client.get(f"{one_seat.base}/trace").content)
    a_id, c_id = first["id"].removeprefix("cmpl-"), c.json()["id"].removeprefix("cmpl-")
    a_rec, b_rec = trace.request(a_id), next(r for r in trace.requests if r.id not in (a_id, c_id))
    assert a_rec.finish_reason == "aborted" and 0 < len(a_rec.output_ids) < 900
    assert b_rec.finish_reason == "aborted" and b_rec.admit_step is None  # left from the queue, never seated
    after = [s for s in trace.steps if s.step >= a_rec.finish_step]
    assert after and all(a_id not in [e[1] for e in s.seats] for s in after)  # gone from the next step on
    c_blocks = -(-(len(trace.request(c_id).prompt_ids) + 20) // 16)
    assert all(s.kv_blocks_used <= c_blocks for s in after)  # only C's blocks: A's were given back


def test_the_engine_process_answers_questions_and_its_death_ends_every_stream(shipped_model, client):
    """ask() carries a picklable question (a module-level function) to the engine's process; if that process dies,
    an open stream ends with an error event and [DONE], /health says so, new requests get 503: nobody waits forever."""
    loop = build_loop(shipped_model, slots=1, process=True)
    with ServerThread(loop) as server:
        assert loop.ask(serve_loop.gauges).result(10)["kv_blocks_total"] == loop.config["num_blocks"]
        with client.stream("POST", f"{server.url}/completions", json={"prompt": "count down from 5", "stream": True}
                           | LONG) as running:  # fmt: skip
            lines = running.iter_lines()
            next(lines)
            loop.process.kill()
            rest = [line for line in lines if line]
        health = client.get(f"{server.base}/health")
        after = client.post(f"{server.url}/completions", json={"prompt": "spell 4"})
    assert rest[-1] == "data: [DONE]" and "engine failed" in json.loads(rest[-2][6:])["error"]["message"]
    assert health.status_code == 503 and after.status_code == 503 and "error" in after.json()


def test_a_client_that_stops_waiting_for_a_whole_reply_is_aborted_too(shipped_model, client):
    with ServerThread(build_loop(shipped_model, slots=1)) as one_seat:
        with pytest.raises(httpx.ReadTimeout):
            client.post(f"{one_seat.url}/completions", json={"prompt": "count down from 5"} | LONG, timeout=0.5)
        wait_for(lambda: gauges(client, one_seat.base)["minillm_requests_running"] == 0)
        trace = trace_file.loads(client.get(f"{one_seat.base}/trace").content)
    assert trace.requests[0].finish_reason == "aborted" and len(trace.requests[0].output_ids) < 900


def test_the_live_trace_keeps_a_bounded_window_that_metrics_read(shipped_model, client):
    with ServerThread(build_loop(shipped_model, slots=2, keep_steps=10)) as short:
        for n in (20, 15, 12):
            client.post(
                f"{short.url}/chat/completions",
                json={"messages": [{"role": "user", "content": f"count down from {n}"}]},
            )
        data = client.get(f"{short.base}/trace").json()
        last = trace_file.loads(client.get(f"{short.base}/trace", params={"last_steps": 3}).content)
        first = data["config"]["first_step"]
        since = trace_file.loads(client.get(f"{short.base}/trace", params={"since_step": first + 4}).content)
        bad = client.get(f"{short.base}/trace", params={"last_steps": 0})
        kept = short.loop.ask(lambda engine: len(engine.requests)).result(10)
    trace = trace_file.from_dict(data)
    assert 10 <= len(trace.steps) <= 20 and trace.config["first_step"] > 0  # older steps were forgotten
    assert [s.step for s in trace.steps] == list(range(len(trace.steps)))  # renumbered from 0
    assert summarize(trace)["output_tokens"] == sum(s.tokens for s in trace.steps)
    assert len(last.steps) == 3 and last.config["first_step"] == first + len(trace.steps) - 3
    assert since.config["first_step"] == first + 5
    assert bad.status_code == 400
    assert kept < 3  # the engine forgot the requests that finished before its window


def test_requests_that_never_had_a_seat_are_bounded_too(shipped_model):
    loop = build_loop(shipped_model, keep_steps=5).start()
    try:
        streams = [TokenStream() for _ in range(40)]
        for i, stream in enumerate(streams):
            loop.submit(Request(f"bad{i}", encode_prompt("spell 4"), 0), stream)  # max_new_tokens 0: refused
        events = [stream.get(timeout=10) for stream in streams]
        kept = loop.ask(lambda engine: [r.id for r in engine.requests]).result(10)
    finally:
        loop.stop()
    assert {(e.kind, e.status) for e in events} == {("refused", 400)}
    assert len(kept) <= 10 and kept[-1] == "bad39"  # the newest are kept


def test_a_second_request_with_a_live_id_is_refused_and_the_first_is_served(shipped_model):
    loop = build_loop(shipped_model, slots=2).start()
    first, second = TokenStream(), TokenStream()
    try:
        loop.submit(Request("same", encode_prompt("count down from 9"), 20), first)
        loop.submit(Request("same", encode_prompt("spell 4"), 5), second)
        refused = second.get(timeout=10)
        events = [first.get(timeout=10)]
        while events[-1].kind != "done":
            events.append(first.get(timeout=10))
    finally:
        loop.stop()
    assert (refused.kind, refused.status) == ("refused", 400) and "already queued or running" in refused.detail
    assert [t for e in events if e.kind == "tokens" for t in e.tokens] == expected(
        shipped_model, "count down from 9", 20
    )


# --- the soak ------------------------------------------------------------------------------------
SOAK_MAX_TOKENS = 8
SOAK_HANG_UP_TOKENS = 32  # a hanging-up client's reply, EOS ignored: 27 or more steps left after it hangs up
SOAK_SYSTEM_PROMPT = "You are a counting robot. Reply with the answer only."  # its blocks are shared (prefix cache)


def soak_jobs(n: int, seed: int = 0) -> list[Job]:
    """n short requests over 30 different prompts, some behind a system prompt, a tenth of them asking for a long reply
    and hanging up after 0 to 5 chunks."""
    rng = random.Random(seed)
    prompts = [f"count down from {k}" for k in range(3, 18)] + [f"spell {rng.randrange(10**5)}" for _ in range(15)]
    jobs = []
    for _ in range(n):
        preamble = SOAK_SYSTEM_PROMPT if rng.random() < 0.3 else None
        hang = rng.randint(0, 5) if rng.random() < 0.1 else None
        max_tokens = rng.randint(2, SOAK_MAX_TOKENS)
        if hang is not None:  # long enough that the hang-up reaches the engine before the reply ends, even when loaded
            max_tokens = SOAK_HANG_UP_TOKENS
        job = Job(rng.choice(prompts), max_tokens, preamble=preamble, ignore_eos=hang is not None, hang_up_after=hang)
        jobs.append(job)
    return jobs


def offline_replies(model, prompts: set[tuple[str, str | None]], max_tokens: int) -> dict:
    """Each (prompt, system prompt)'s greedy reply from an offline engine on another path than the server's:
    contiguous KV, no prefix caching, no token budget (tests/test_engine.py holds that path to the plain loop)."""
    engine = LayeredEngine(model, ContinuousScheduler(token_budget=0), EngineConfig(slots=16, kv="contiguous"))
    requests = {key: Request(str(i), encode_prompt(*key), max_tokens) for i, key in enumerate(sorted(prompts, key=str))}
    for r in requests.values():
        engine.submit(r)
    engine.run()
    return {key: r.output_ids for key, r in requests.items()}


@pytest.mark.slow
def test_soak_500_streams_from_64_clients_with_hang_ups(shipped_model):
    jobs = soak_jobs(500)
    loop = build_loop(
        shipped_model, slots=8, num_blocks=36, block_size=4, prefix_caching=True, process=True
    )  # fmt: skip  (~50 preemptions)
    with ServerThread(loop) as soak, httpx.Client(timeout=60) as client:
        outcomes = asyncio.run(run_jobs(soak.url, jobs, max_concurrency=64, extra_body={"return_token_ids": True}))
        wait_for(lambda: gauges(client, soak.base)["minillm_requests_running"] == 0)
        end = gauges(client, soak.base)
        health = client.get(f"{soak.base}/health")
        trace = trace_file.loads(client.get(f"{soak.base}/trace").content)
    replies = offline_replies(shipped_model, {(j.prompt, j.preamble) for j in jobs}, SOAK_MAX_TOKENS)
    hung_up = [o for o in outcomes if o.hung_up]
    assert not [o.error for o in outcomes if o.error]
    assert len(hung_up) >= 10
    for o in outcomes:
        if o.job.hang_up_after is not None and not o.hung_up:  # (its tokens came in fewer chunks than it waited for)
            assert o.output_tokens == SOAK_HANG_UP_TOKENS, o.job
        elif not o.hung_up:
            want = replies[o.job.prompt, o.job.preamble][: o.job.max_tokens]
            assert o.token_ids == want and o.output_tokens == len(want), o.job
    ends = {r.id: r.finish_reason for r in trace.requests}
    aborted = [ends[o.response_id.removeprefix("chatcmpl-")] for o in hung_up if o.response_id]
    assert set(aborted) <= {"aborted", "length"} and len(aborted) >= len(hung_up) - 5  # (0 chunks: maybe no id yet)
    assert aborted.count("aborted") >= len(aborted) - 2  # 27+ steps left when each hung up: all but a rare late one
    assert end["minillm_kv_blocks_used"] == 0 and end["minillm_requests_running"] == 0
    assert end["minillm_requests_waiting"] == 0 and health.json()["status"] == "ok"
    print(f"\nsoak: {len(outcomes)} streams, {len(hung_up)} hung up ({aborted.count('aborted')} aborted mid-way), "
          f"{int(end['minillm_preemptions_total'])} preemptions, {len(trace.steps)} steps")  # fmt: skip
