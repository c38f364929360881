"""`serve --disaggregate`: a prefill engine and a decode engine, each in a process of its own, the KV sent between them
with torch.distributed. Replies equal one engine's token for token; no block is left behind on either side (both
engines check their books every step: debug mode); an engine that dies fails the requests it held cleanly, and the
other side frees what it held for them; nothing outlives the server."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch
from openai import AsyncOpenAI

from minillm.engine.generate import generate
from minillm.layers import generate as reference
from minillm.model.tokenizer import decode, encode_prompt
from minillm.serving.server import ServerThread, build_loop
from minillm.training.tasks import PREAMBLES
from tests.test_tensor_parallel_faults import alive, children, wait_until

MAX_TOKENS = 400  # (the longest prompt, after the rules preamble, leaves 430 of the 1024-token context)
ASKS = [("count down from 40", None), ("spell 70421", None), ("count down from 9", PREAMBLES["teacher"]),
        ("spell 5", PREAMBLES["rules"]), ("count down from 120", PREAMBLES["rules"]), ("spell 31", None)]  # fmt: skip


def books(engine) -> tuple[int, int, int]:
    """(free blocks, all blocks, requests held for a hand-over), read between two steps."""
    alloc = engine.cache.allocator
    return alloc.num_free, alloc.num_blocks, len(engine.held)


@pytest.fixture
def pair(shipped_model, monkeypatch):
    monkeypatch.setenv("MINILLM_DEBUG", "1")  # (both engine processes check their KV books every step)
    loop = build_loop(shipped_model, slots=3, disaggregate=True, prefix_caching=True)
    with ServerThread(loop) as server:
        yield loop, server
    pids = [loop.prefill.process.pid, loop.decode.process.pid]
    assert wait_until(lambda: not any(alive(p) or children(p) for p in pids), 15), "a process outlived the server"


async def ask_all(url: str) -> list[str]:
    client = AsyncOpenAI(base_url=url, api_key="none")

    async def one(prompt, preamble):
        system = [{"role": "system", "content": preamble}] if preamble else []
        messages = system + [{"role": "user", "content": prompt}]
        reply = await client.chat.completions.create(model="minillm", messages=messages, max_tokens=MAX_TOKENS)
        return reply.choices[0].message.content

    return await asyncio.gather(*(one(p, pre) for p, pre in ASKS))


def test_replies_equal_one_engines_and_both_pools_end_empty(pair, shipped_model):
    loop, server = pair
    replies = asyncio.run(ask_all(server.url))
    for (prompt, preamble), text in zip(ASKS, replies):
        assert text == decode(generate(shipped_model, encode_prompt(prompt, preamble), MAX_TOKENS).tokens), prompt
    for engine in (loop.prefill, loop.decode):
        free, total, held = engine.ask(books).result(10)
        assert free == total and held == 0, "KV blocks left behind"
    prompts_on_decode, reasons = loop.decode.ask(work).result(10)
    assert prompts_on_decode == 0 and reasons <= {"eos", "length"}, "the decode engine ran a prompt"
    prompts_on_prefill, reasons = loop.prefill.ask(work).result(10)
    assert prompts_on_prefill > 0 and reasons == {"handed-over"}, reasons


def work(engine) -> tuple[int, set]:
    """(prompt tokens the engine computed, how its requests ended): asked of an engine process."""
    return sum(r.prefill_tokens for r in engine.requests), {r.finish_reason for r in engine.requests}


def test_logprobs_go_on_across_the_hand_over_and_neither_engine_keeps_them(pair, client, shipped_model):
    """A reply's first token (and its logprobs) is the prefill engine's, the rest the decode engine's: one entry per
    token, each the model's own; sampled with a seed, the reply is the one-user loop's (the seed crossed too). Once
    replied, neither engine keeps its logprobs or its mark (a server runs for days)."""
    loop, server = pair
    prompt = encode_prompt("spell 7")
    body = {"messages": [{"role": "user", "content": "spell 7"}], "logprobs": True, "top_logprobs": 2,
            "max_tokens": 12, "ignore_eos": True, "temperature": 0.8, "seed": 3, "return_token_ids": True}  # fmt: skip
    choice = client.post(f"{server.url}/chat/completions", json=body).json()["choices"][0]
    ids, entries = choice["token_ids"], choice["logprobs"]["content"]
    assert ids == reference(shipped_model, prompt, 12, temperature=0.8, seed=3, ignore_eos=True).tokens
    assert len(entries) == len(ids) == 12  # (token 1 from the prefill engine, 2 to 12 from the decode engine)
    with torch.no_grad():
        want = shipped_model(torch.tensor([prompt + ids]))[0].log_softmax(-1)  # (T, V)
    for i, entry in enumerate(entries):
        assert entry["logprob"] == pytest.approx(want[len(prompt) - 1 + i, ids[i]].item(), abs=1e-4), i
    for engine in (loop.prefill, loop.decode):
        assert engine.ask(kept).result(10) == (0, 0), "logprobs or marks kept after the reply"


def kept(engine) -> tuple[int, int]:
    """(requests whose logprobs the engine keeps, requests marked for hand-over): asked of an engine process."""
    return len(engine.sampler.logprobs), len(engine.handover.marked)


def test_a_decode_engine_that_dies_fails_the_request_and_the_prefill_side_frees_its_blocks(pair, client):
    loop, server = pair
    os.kill(loop.decode.process.pid, signal.SIGKILL)
    assert wait_until(lambda: not loop.decode.alive, 10)
    reply = client.post(f"{server.url}/chat/completions",
                        json={"messages": [{"role": "user", "content": "count down from 30"}]})  # fmt: skip
    assert reply.status_code == 503 and "error" in reply.json()
    free, total, held = loop.prefill.ask(books).result(10)
    assert free == total and held == 0, "the prefill side kept a dead hand-over's blocks"


def test_a_prefill_engine_that_dies_turns_the_server_to_503(pair, client):
    loop, server = pair
    os.kill(loop.prefill.process.pid, signal.SIGKILL)
    assert wait_until(lambda: not loop.prefill.alive, 10)
    reply = client.post(f"{server.url}/chat/completions", json={"messages": [{"role": "user", "content": "spell 4"}]})
    assert reply.status_code == 503
