"""Benchmark of the HTTP server: what serving over HTTP costs, against the same engine offline.

The server runs as `python -m minillm serve` in a process of its own and the load generator in this
one, as in a workshop (on a 2-core machine: one core each, more or less). Two figures:

  throughput   a chat crowd, everyone sent at once: output tokens/s the client counts, over the
               tokens/s the same engine reaches offline (`run`) on the same users
  TTFT added   one user at a time: the client's time to first token minus the engine's own (arrival to
               first token, from the server's /trace): the HTTP request, the hand-over to the engine
               thread, and the first chunk's way back
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time

import httpx

from minillm.model.transformer import Transformer
from minillm.runs.workload import ChatKnobs

SLOTS = 8  # `serve`'s and `run`'s default seats


def start_server(port: int) -> subprocess.Popen:
    """`python -m minillm serve` on the shipped model, once it answers /health."""
    command = [sys.executable, "-m", "minillm", "serve", "--port", str(port), "--slots", str(SLOTS)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server did not start: {server.stderr.read().strip()[-500:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the server did not answer /health within 120 s")


def free_port() -> int:
    from minillm.serving.server import bind

    sock = bind(port=0)
    port = sock.getsockname()[1]
    sock.close()
    return port


def bench_server(model: Transformer, s) -> dict:
    from minillm.bench.common import serve
    from minillm.runs import trace_file
    from minillm.runs.metrics import summarize
    from minillm.serving.loadgen import jobs_from_workload, run_jobs, summarize_load

    requests, singles, rounds = (64, 10, 1) if s.quick else (200, 30, 3)
    knobs = ChatKnobs(requests=requests, rate=1000, force_lengths=True)  # everyone queued at step 0
    jobs = jobs_from_workload("chat", requests, None, seed=0, force_lengths=True)  # the same users
    port = free_port()
    server = start_server(port)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        pairs = []  # (offline, through the server), run in turn: a noisy minute hits both alike
        for _ in range(rounds):
            offline = serve(model, "chat", "continuous", "paged", SLOTS, knobs)[0]
            crowd = summarize_load(asyncio.run(run_jobs(url, jobs)))
            pairs.append((offline["tokens_per_s"], crowd["tokens_per_s"], crowd["finished"]))
        one_by_one = jobs_from_workload("chat", singles, None, seed=1, force_lengths=True)
        steps_before = httpx.get(f"http://127.0.0.1:{port}/health").json()["steps"]
        alone = summarize_load(asyncio.run(run_jobs(url, one_by_one, max_concurrency=1)))
        trace = httpx.get(f"http://127.0.0.1:{port}/trace", params={"since_step": steps_before}, timeout=60)
        engine = summarize(trace_file.from_dict(trace.json()))
    finally:
        server.terminate()
        server.wait(10)
    ratios = [served / offline for offline, served, _ in pairs]
    ratio = statistics.median(ratios)
    added = alone["ttft_p50_s"] - engine["ttft_p50_s"]
    finished = min(done for *_, done in pairs)
    return {"requests": requests, "finished": finished, "ratios": ratios,
            "server_tokens_per_s": statistics.median(p[1] for p in pairs),
            "offline_tokens_per_s": statistics.median(p[0] for p in pairs), "ratio": ratio, "goal": 0.8,
            "singles": singles, "client_ttft_p50_s": alone["ttft_p50_s"], "engine_ttft_p50_s": engine["ttft_p50_s"],
            "ttft_added_p50_s": added, "met": ratio >= 0.8 and finished == requests}  # fmt: skip


def markdown(r: dict) -> list[str]:
    verdict = "**met**" if r["met"] else "**not met**"
    return ["## 12. The engine behind an HTTP server", "",
            f"`python -m minillm serve` ({SLOTS} seats) in its own process, the load generator in the bench's: "
            f"{r['requests']} `chat` users sent at once, in {len(r['ratios'])} rounds (the same users offline, then "
            f"through the server; at least {r['finished']} finished in each). Medians: the client counted "
            f"{r['server_tokens_per_s']:.0f} output tokens/s; the same engine offline (`run`) "
            f"{r['offline_tokens_per_s']:.0f}. Ratio {r['ratio']:.2f} (rounds: "
            f"{', '.join(f'{x:.2f}' for x in r['ratios'])}), goal at least {r['goal']}: {verdict}. The server's "
            "process runs the engine and the HTTP side under one interpreter lock, so every token's "
            "JSON and socket work is taken from the engine's steps.", "",
            f"One user at a time ({r['singles']} of them): time to first token p50 {1e3 * r['client_ttft_p50_s']:.1f} "
            f"ms at the client, {1e3 * r['engine_ttft_p50_s']:.1f} ms inside the engine (arrival to first token): "
            f"HTTP and streaming add {1e3 * r['ttft_added_p50_s']:.1f} ms.", ""]  # fmt: skip
