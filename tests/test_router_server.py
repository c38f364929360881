"""The server with replicas (serve --replicas 2): two engine processes behind one endpoint, driven by the `openai`
client. Replies equal one engine's token for token; a shared system prompt lands on the replica that holds it (cache
aware, even when that replica is the busier); /health, /trace?replica= and /metrics name each replica; a replica that
dies mid-reply ends that reply with a clear error while the other serves on; `python -m minillm serve --replicas 2`
starts and stops cleanly. Every server here stops its processes, even when a test fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from minillm.bench.server import answering, free_port
from minillm.engine.generate import generate
from minillm.layers import generate as sampled_generate
from minillm.model.tokenizer import BOS, encode, encode_prompt
from minillm.runs import trace_file
from minillm.runs.metrics import prefix_cache_figures
from minillm.serving.server import ServerThread, build_fleet
from minillm.training import tasks

SYSTEM = tasks.PREAMBLES["workshop"]  # 425 tokens with its prompt: 26 full blocks of 16


@pytest.fixture(scope="module")
def fleet(shipped_model):
    with ServerThread(build_fleet(shipped_model, 2, "cache-aware", slots=2, prefix_caching=True)) as running:
        yield running


@pytest.fixture
def api(fleet):
    with openai.OpenAI(base_url=fleet.url, api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def chat(prompt: str, system: str | None = None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def until(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def routes_of(router, response_id: str) -> list[tuple[int, str]]:
    """Where the router sent the request behind a response ("chatcmpl-r7": request r7), and why."""
    rid = response_id.split("-", 1)[1]
    return [(replica, reason) for r, replica, reason in router.log if r == rid]


def test_replies_equal_one_engines_token_for_token_on_both_replicas(fleet, shipped_model):
    """Six users at once (so both replicas serve), streamed and whole, chat and completions, greedy."""
    teacher = tasks.PREAMBLES["teacher"]
    asks = [("count down from 9", None, 30), ("spell 305", SYSTEM, 40), ("count down from 14", None, 25),
            ("spell 71", teacher, 30), ("count down from 6", None, 20), ("spell 12", None, 20)]  # fmt: skip

    async def one(client: openai.AsyncOpenAI, i: int, prompt: str, system: str | None, max_tokens: int):
        extra = {"return_token_ids": True}
        if i % 3 == 2:  # completions: the raw text after <bos>
            reply = await client.completions.create(model="minillm", prompt=prompt, max_tokens=max_tokens,
                                                    extra_body=extra)  # fmt: skip
            return reply.id, reply.choices[0].token_ids, [BOS, *encode(prompt)]
        messages, ids = chat(prompt, system), encode_prompt(prompt, system)
        if i % 2:
            stream = await client.chat.completions.create(model="minillm", messages=messages, max_tokens=max_tokens,
                                                          stream=True, extra_body=extra)  # fmt: skip
            chunks = [chunk async for chunk in stream]
            tokens = [t for c in chunks for choice in c.choices for t in (choice.model_extra.get("token_ids") or [])]
            return chunks[0].id, tokens, ids
        reply = await client.chat.completions.create(model="minillm", messages=messages, max_tokens=max_tokens,
                                                     extra_body=extra)  # fmt: skip
        return reply.id, reply.choices[0].model_extra["token_ids"], ids

    async def everyone():
        async with openai.AsyncOpenAI(base_url=fleet.url, api_key="unused", max_retries=0, timeout=60) as client:
            return await asyncio.gather(*(one(client, i, *ask) for i, ask in enumerate(asks)))

    replies = asyncio.run(everyone())
    for (response_id, tokens, prompt_ids), (_, _, max_tokens) in zip(replies, asks):
        assert tokens == generate(shipped_model, prompt_ids, max_tokens).tokens, response_id
    assert {routes_of(fleet.loop, rid)[0][0] for rid, _, _ in replies} == {0, 1}


def test_a_shared_system_prompt_lands_on_the_replica_that_holds_it(fleet, api, shipped_model):
    """A long reply on the workshop's system prompt keeps one replica busy; a user without a system prompt goes to
    the idle one; the next workshop user goes to the busier replica anyway: its cache holds the 26 blocks."""
    router = fleet.loop
    long_one = api.chat.completions.create(model="minillm", messages=chat("count down from 30", SYSTEM),
                                           max_tokens=400, stream=True, extra_body={"ignore_eos": True})  # fmt: skip
    other = None
    try:
        first = next(iter(long_one))
        (holder, _), *_ = routes_of(router, first.id)
        other = api.chat.completions.create(model="minillm", messages=chat("count down from 20"), max_tokens=300,
                                            stream=True, extra_body={"ignore_eos": True})  # fmt: skip
        assert routes_of(router, next(iter(other)).id)[0][0] == 1 - holder  # (least loaded: no cached prefix)
        hits_before = router.replicas[holder].hit_tokens
        reply = api.chat.completions.create(model="minillm", messages=chat("spell 42", SYSTEM), max_tokens=30,
                                            extra_body={"return_token_ids": True})  # fmt: skip
        assert routes_of(router, reply.id) == [(holder, "prefix_hit")]
        want = generate(shipped_model, encode_prompt("spell 42", SYSTEM), 30).tokens
        assert reply.choices[0].model_extra["token_ids"] == want
        served = lambda: router.replicas[holder].hit_tokens - hits_before  # noqa: E731 (the router's next poll)
        assert until(lambda: served() >= 26 * 16), served()
    finally:
        long_one.close()  # (hanging up aborts the long replies)
        if other is not None:
            other.close()


def test_n_replies_go_with_their_first_to_one_replica(fleet, api, shipped_model):
    """The openai client's n = 3: replies 1 and 2 follow reply 0 to its replica (to share its prompt's blocks), each
    its lone seeded twin."""
    extra = {"return_token_ids": True, "ignore_eos": True}
    reply = api.chat.completions.create(model="minillm", messages=chat("what is 7"), n=3, temperature=2.0, seed=9,
                                        max_tokens=12, extra_body=extra)  # fmt: skip
    ids = encode_prompt("what is 7")
    alone = lambda seed: sampled_generate(shipped_model, ids, 12, temperature=2.0, seed=seed, ignore_eos=True).tokens
    twins = [alone(9 + i) for i in range(3)]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.model_extra["token_ids"] for c in reply.choices] == twins
    rid = reply.id.split("-", 1)[1]
    routes = [(r, replica, reason) for r, replica, reason in fleet.loop.log if r.split("#")[0] == rid]
    assert [reason for *_, reason in routes][1:] == ["sibling reply"] * 2 and len({r[1] for r in routes}) == 1


def test_health_trace_and_metrics_name_each_replica(fleet, api):
    api.chat.completions.create(model="minillm", messages=chat("spell 8"), max_tokens=10)
    health = httpx.get(f"{fleet.base}/health").json()
    assert health["status"] == "ok" and [r["replica"] for r in health["replicas"]] == [0, 1]
    assert all(r["state"] == "ok" for r in health["replicas"])
    for replica in (0, 1):
        trace = httpx.get(f"{fleet.base}/trace", params={"replica": replica, "last_steps": 5}).json()
        assert trace["config"]["replica"] == replica
    assert httpx.get(f"{fleet.base}/trace").json()["config"]["replica"] == 0  # (replica 0 unless asked)
    wrong = httpx.get(f"{fleet.base}/trace", params={"replica": 2})
    assert wrong.status_code == 400 and "replica must lie in [0, 1]" in wrong.json()["error"]["message"]
    text = httpx.get(f"{fleet.base}/metrics").text
    for replica in (0, 1):
        assert f'minillm_requests_running{{replica="{replica}"}}' in text
        assert f'minillm_replica_up{{replica="{replica}"}} 1' in text
    assert text.count("# HELP minillm_requests_running ") == 1 and "minillm_router_routed_total{" in text


def test_the_prefix_cache_figures_in_metrics_are_the_traces(fleet, api):
    """Per replica, /metrics' prefix-cache queries and hits are the prompt tokens and cache hits of its trace
    (metrics.prefix_cache_figures: each request's first admission), once every reply is done."""
    for prompt in ("spell 19", "count down from 5", "spell 19"):
        api.chat.completions.create(model="minillm", messages=chat(prompt, SYSTEM), max_tokens=8)
    lines, served = [], 0
    for replica in (0, 1):
        trace = trace_file.from_dict(httpx.get(f"{fleet.base}/trace", params={"replica": replica}).json())
        figures = prefix_cache_figures(trace)
        label = f'{{replica="{replica}"}}'
        lines += [f"minillm_prefix_cache_queries_total{label} {figures['prompt_tokens']}",
                  f"minillm_prefix_cache_hits_total{label} {figures['prompt_tokens_from_cache']}"]  # fmt: skip
        served += figures["prompt_tokens_from_cache"]
    text = lambda: httpx.get(f"{fleet.base}/metrics").text.splitlines()  # noqa: E731 (hits: as of the next poll)
    assert until(lambda: set(lines) <= set(text())), [line for line in text() if "prefix_cache" in line]
    assert served >= 2 * 26 * 16  # (the second and third workshop users, at least)


def test_a_replica_that_dies_mid_reply_ends_it_clearly_and_the_other_serves_on(shipped_model):
    with ServerThread(build_fleet(shipped_model, 2, "round-robin", slots=2)) as server:
        router = server.loop
        with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60) as client:
            long_reply = {"max_tokens": 600, "stream": True, "extra_body": {"ignore_eos": True}}
            stream = client.chat.completions.create(model="minillm", messages=chat("count down from 9"), **long_reply)
            first = next(iter(stream))
            (victim, _), *_ = routes_of(router, first.id)
            killer = threading.Timer(0.2, router.replicas[victim].loop.process.kill)
            killer.start()
            with pytest.raises(openai.APIError, match=f"replica {victim} failed"):
                for _ in stream:
                    pass
            killer.join()
            health = httpx.get(f"{server.base}/health")
            states = {r["replica"]: r["state"] for r in health.json()["replicas"]}
            assert health.status_code == 200 and states == {victim: "failed", 1 - victim: "ok"}
            for _ in range(3):  # round robin goes on with the replica left
                reply = client.chat.completions.create(model="minillm", messages=chat("spell 9"), max_tokens=10)
                assert routes_of(router, reply.id)[0][0] == 1 - victim and reply.choices[0].finish_reason == "stop"
    assert not any(r.loop.process.is_alive() for r in router.replicas)


def test_serve_replicas_from_the_command_line_starts_and_stops_cleanly():
    port = free_port()
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(port), "--replicas", "2", "--slots", "2",
               "--prefix-caching", "--route", "least-loaded"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        answering(server, f"http://127.0.0.1:{port}/health", 120, "the fleet")
        health = httpx.get(f"http://127.0.0.1:{port}/health").json()
        assert [r["state"] for r in health["replicas"]] == ["ok", "ok"]
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0) as client:
            reply = client.chat.completions.create(model="minillm", messages=chat("count down from 3"))
        assert reply.choices[0].message.content == "3 2 1"
        server.send_signal(signal.SIGTERM)
        code = server.wait(30)
    finally:
        server.kill()
    out, err = server.stdout.read(), server.stderr.read()
    assert code == 0 and "2 replicas, least-loaded routing" in out
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


WRONG_FLAGS = [(["--route", "round-robin"], "--route chooses among replicas"),
               (["--replicas", "2", "--engine", "thread"], "drop --engine thread")]  # fmt: skip


@pytest.mark.parametrize("flags, message", WRONG_FLAGS)
def test_replica_flags_that_cannot_work_are_one_line(capsys, flags, message):
    from minillm.__main__ import main

    code = main(["serve", "--port", "0", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
