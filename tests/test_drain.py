"""Stopping a server gently: `python -m minillm serve` in a process of its own, replies in flight, then SIGTERM (or
Ctrl-C, which the terminal sends to every process of the server). New requests get 503; the replies in flight
finish within --drain-s, or end with finish_reason "abort", each with its last chunk and [DONE]; one line in the log,
no traceback, exit code 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx

from minillm.bench.server import answering, free_port

CHAT = "/v1/chat/completions"


def start_server(port: int, drain_s: float) -> subprocess.Popen:
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(port), "--slots", "3", "--drain-s", str(drain_s)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    return answering(server, f"http://127.0.0.1:{port}/health", 120, "the server")


def body(prompt: str, **options) -> dict:
    return {"messages": [{"role": "user", "content": prompt}]} | options


async def stream(client: httpx.AsyncClient, url: str, request: dict, started: asyncio.Event) -> list:
    """Every event of a streamed reply, read to its end; `started` is set at its first text."""
    events = []
    async with client.stream("POST", url, json=request | {"stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                if len(events) >= 2:
                    started.set()
    return events


def finish_of(events: list) -> str:
    assert events[-1] == "[DONE]", events[-3:]
    return events[-2]["choices"][0]["finish_reason"]


async def drain_scenario(port: int, server: subprocess.Popen, stop) -> dict:
    """Three replies at once, one seat each: a short stream, a 1000-token stream and a 1000-token whole reply."""
    url = f"http://127.0.0.1:{port}{CHAT}"
    async with httpx.AsyncClient(timeout=60) as client:
        short_started, long_started = asyncio.Event(), asyncio.Event()
        short = asyncio.create_task(stream(client, url, body("count down from 12"), short_started))
        long = asyncio.create_task(stream(client, url, body("count down from 5", ignore_eos=True, max_tokens=1000),
                                          long_started))  # fmt: skip
        whole = asyncio.create_task(client.post(url, json=body("count down from 7", ignore_eos=True, max_tokens=1000)))
        await asyncio.wait_for(asyncio.gather(short_started.wait(), long_started.wait()), 60)
        stop()
        await asyncio.sleep(0.3)
        try:
            refused = await client.post(url, json=body("spell 4"))
        except httpx.HTTPError:  # (already closed: nothing was left to wait for)
            refused = None
        return {"short": await short, "long": await long, "whole": await whole, "refused": refused}


def test_sigterm_drains_a_stream_in_flight_then_aborts_the_rest_cleanly():
    port = free_port()
    server = start_server(port, drain_s=1.5)
    try:
        began = time.monotonic()
        got = asyncio.run(drain_scenario(port, server, lambda: server.send_signal(signal.SIGTERM)))
        code = server.wait(30)
        took = time.monotonic() - began
    finally:
        server.kill()
    log = server.stderr.read()
    assert got["refused"].status_code == 503 and "shutting down" in got["refused"].json()["error"]["message"]
    assert finish_of(got["short"]) == "stop"  # it finished within the drain
    short_text = "".join(e["choices"][0]["delta"].get("content", "") for e in got["short"][:-1] if e["choices"])
    assert short_text.startswith("12 11 10")
    assert finish_of(got["long"]) == "abort"  # 1000 tokens do not fit in 1.5 s: cut short, cleanly
    whole = got["whole"].json()
    assert got["whole"].status_code == 200 and whole["choices"][0]["finish_reason"] == "abort"
    assert 0 < whole["usage"]["completion_tokens"] < 1000
    assert code == 0 and took < 20
    assert "Traceback" not in log and len(log.strip().splitlines()) == 1 and "stopping" in log, log


def test_ctrl_c_twice_ends_the_replies_at_once():
    """The terminal sends Ctrl-C to the server's whole process group, its engine process too: that one must not
    stop (or print a traceback) on its own. The second Ctrl-C ends what is left now, not after --drain-s."""
    port = free_port()
    server = start_server(port, drain_s=60)
    ctrl_c = lambda: os.killpg(server.pid, signal.SIGINT)

    def twice():
        ctrl_c()
        time.sleep(0.2)
        ctrl_c()

    try:
        began = time.monotonic()
        got = asyncio.run(drain_scenario(port, server, twice))
        code = server.wait(30)
        took = time.monotonic() - began
    finally:
        server.kill()
    log = server.stderr.read()
    assert finish_of(got["long"]) == "abort" and got["whole"].json()["choices"][0]["finish_reason"] == "abort"
    assert code == 0 and took < 30  # not the 60 s of --drain-s
    assert "Traceback" not in log and len(log.strip().splitlines()) == 1, log
